/*
 * test_router.c -- mxfp8_router_linear, mxfp8_router_linear_input_grad and mxfp8_router_linear_weight_grad against
 * the oracle's fmaf chains (tests/c/oracle/router.c, written from the header's definition), bit for bit: shapes
 * across the tile edges (8 and 32 rows / columns, the 512-step chunks of a chain, empty extents), F32 / BF16 / F16
 * inputs as contiguous, transposed and sliced views, biases of each dtype, F32 / BF16 / F16 gradients with and
 * without accumulation, 1 / 2 / 3 threads and every F32-panel microkernel this CPU can run (the reference
 * included); each row's logits and input gradient computed alone equal those inside the batch; the chains lie
 * within the FP64 error bound of a chain of that length (a check of the oracle); a caller's FTZ / DAZ MXCSR does not
 * flush subnormal products; bad arguments return their status, name the parameter and write nothing.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_list.h"
#include "oracle.h"
#include "testutil.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define HAVE_MXCSR 1
#endif

/* A 2-D view [R, C] of dtype dt in one of three layouts, and its values as the library reads them (FP32,
 * row-major). layout 0: contiguous; 1: transposed (column-major); 2: every other column of rows padded by 3. */
typedef struct mat {
    void *buf;
    mxfp8_tensor v;
    float *val;
    int64_t R, C;
} mat;

static float widen(mxfp8_dtype dt, const void *buf, int64_t off) {
    if (dt == MXFP8_DTYPE_F32) return ((const float *)buf)[off];
    uint16_t h = ((const uint16_t *)buf)[off];
    return (float)(dt == MXFP8_DTYPE_BF16 ? orc_bf16_value(h) : orc_fp16_value(h));
}

static void put(mxfp8_dtype dt, void *buf, int64_t off, float x) {
    if (dt == MXFP8_DTYPE_F32) ((float *)buf)[off] = x;
    else ((uint16_t *)buf)[off] = dt == MXFP8_DTYPE_BF16 ? orc_bf16_encode(x) : orc_fp16_encode(x);
}

static mat make(int64_t R, int64_t C, mxfp8_dtype dt, int layout, tu_rng *rng, int emin, int espan) {
    mat m = {0};
    m.R = R, m.C = C;
    int64_t rs = C, cs = 1;
    if (layout == 1) rs = 1, cs = R;
    if (layout == 2) cs = 2, rs = 2 * C + 3;
    int64_t n = (R > 0 && C > 0) ? (R - 1) * rs + (C - 1) * cs + 1 : 1;
    size_t es = dt == MXFP8_DTYPE_F32 ? 4 : 2;
    m.buf = tu_alloc((size_t)n * es);
    memset(m.buf, 0xA5, (size_t)n * es);
    m.val = tu_alloc((size_t)(R * C + 1) * sizeof(float));
    for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) {
            float x = (float)(tu_uniform(rng) * 2 - 1) * ldexpf(1.0f, emin + (int)(tu_next(rng) % (uint64_t)espan));
            put(dt, m.buf, r * rs + c * cs, x);
            m.val[r * C + c] = widen(dt, m.buf, r * rs + c * cs);
        }
    int64_t sh[2] = {R, C};
    m.v = mxfp8_tensor_make(m.buf, dt, 2, sh);
    m.v.strides[0] = rs;
    m.v.strides[1] = cs;
    return m;
}

static void unmake(mat *m) { free(m->buf), free(m->val); }

/* The element (r, c) of an output view as it is stored, and the value expected there: RNE(old + chain) or
 * RNE(chain) in the view's dtype, as bits. */
static uint32_t stored_bits(const mat *m, int64_t r, int64_t c) {
    int64_t off = r * m->v.strides[0] + c * m->v.strides[1];
    if (m->v.dtype == MXFP8_DTYPE_F32) return tu_f32_bits(((const float *)m->buf)[off]);
    return ((const uint16_t *)m->buf)[off];
}
static uint32_t expect_bits(mxfp8_dtype dt, float chain, float old, int accumulate) {
    float s = accumulate ? old + chain : chain;
    if (dt == MXFP8_DTYPE_F32) return tu_f32_bits(s);
    return dt == MXFP8_DTYPE_BF16 ? orc_bf16_encode(s) : orc_fp16_encode(s);
}

/* |chain - exact| <= gamma_n * sum |a b| with gamma_n = n u / (1 - n u), u = 2^-24 (a chain of n fmaf roundings). */
static int within_bound(float chain, const float *a, int64_t as, const float *b, int64_t bs, int64_t n) {
    double exact = 0, mag = 0;
    for (int64_t k = 0; k < n; ++k) {
        exact += (double)a[k * as] * (double)b[k * bs];
        mag += fabs((double)a[k * as] * (double)b[k * bs]);
    }
    double u = ldexp(1.0, -24), g = (double)n * u / (1 - (double)n * u);
    return fabs((double)chain - exact) <= g * mag * 1.0001 + 1e-300;
}

static const char *dn(mxfp8_dtype dt) { return mxfp8_dtype_name(dt); }

typedef struct shape {
    int64_t T, H, E;
} shape;

/* One workspace kept across every case (shapes growing and shrinking, stale contents): the 2-thread calls use it, the
 * others allocate per call; the bits must not depend on it. */
static mxfp8_workspace *g_ws;

/* One problem: every kernel, 1..3 threads, against the oracle. */
static void run_case(shape s, int variant, tu_rng *rng, const mxfp8i_ukernel *const *kernels) {
    const mxfp8_dtype dts[3] = {MXFP8_DTYPE_F32, MXFP8_DTYPE_BF16, MXFP8_DTYPE_F16};
    const mxfp8_dtype xd = dts[variant % 3], wd = dts[(variant + 1) % 2], bd = dts[(variant + 2) % 3];
    const mxfp8_dtype gd = dts[(variant / 2) % 3], wgd = dts[(variant + 1) % 3];
    const int lay = variant % 3, acc = variant % 2, has_bias = variant % 4 != 3;
    const int64_t T = s.T, H = s.H, E = s.E;
    mat x = make(T, H, xd, variant < 3 ? lay : (lay + 2) % 3, rng, -3, 6),
        w = make(E, H, wd, (lay + 1) % 3, rng, -4, 4);
    mat b = make(1, E, bd, 0, rng, -2, 3);
    mat dl = make(T, E, dts[(variant + 2) % 2], (lay + 2) % 3, rng, -6, 8);
    mxfp8_tensor bv = b.v;
    bv.ndim = 1, bv.shape[0] = E, bv.strides[0] = 1;
    const mxfp8_tensor *bias = has_bias ? &bv : NULL;

    float *lo = tu_alloc((size_t)(T * E + 1) * 4), *dxo = tu_alloc((size_t)(T * H + 1) * 4);
    float *dwo = tu_alloc((size_t)(E * H + 1) * 4);
    orc_router_logits(x.val, w.val, has_bias ? b.val : NULL, T, H, E, lo);
    orc_router_input_grad(dl.val, w.val, T, E, H, dxo);
    orc_router_weight_grad(dl.val, x.val, T, E, H, dwo);
    /* the oracle's chains against FP64 (a few elements) */
    for (int64_t i = 0; i < 3 && T > 0 && E > 0 && H > 0; ++i) {
        const int64_t t = (i * 7) % T, e = (i * 5) % E, h = (i * 11) % H;
        TU_CHECK(has_bias || within_bound(lo[t * E + e], x.val + t * H, 1, w.val + e * H, 1, H),
                 "oracle logits bound T %lld H %lld E %lld", (long long)T, (long long)H, (long long)E);
        TU_CHECK(within_bound(dxo[t * H + h], dl.val + t * E, 1, w.val + h, H, E), "oracle dx bound");
        TU_CHECK(within_bound(dwo[e * H + h], dl.val + e, E, x.val + h, H, T), "oracle dw bound");
    }

    for (const mxfp8i_ukernel *const *kp = kernels; *kp; ++kp) {
        mxfp8i_force_ukernel(*kp);
        TU_CHECK(mxfp8i_f32_ukernel() == *kp, "the forced kernel %s is the router's", (*kp)->name);
        for (int nt = 1; nt <= 3; ++nt) {
            mxfp8_set_num_threads(nt);
            mxfp8_workspace *ws = nt == 2 ? g_ws : NULL;
            char what[200];
            snprintf(what, sizeof what,
                     "T %lld H %lld E %lld variant %d (x %s w %s dl %s, dx %s dw %s, acc %d) %s nt %d", (long long)T,
                     (long long)H, (long long)E, variant, dn(xd), dn(wd), dn(dl.v.dtype), dn(gd), dn(wgd), acc,
                     (*kp)->name, nt);
            mat lg = make(T, E, MXFP8_DTYPE_F32, (lay + 1) % 3, rng, 0, 1);
            TU_CHECK(mxfp8_router_linear(&x.v, &w.v, bias, &lg.v, ws) == MXFP8_OK, "%s: %s", what,
                     mxfp8_last_error_message());
            long bad = 0;
            for (int64_t t = 0; t < T; ++t)
                for (int64_t e = 0; e < E; ++e) bad += stored_bits(&lg, t, e) != tu_f32_bits(lo[t * E + e]);
            TU_CHECK(bad == 0, "logits: %ld elements differ from the chain, %s", bad, what);

            mat gx = make(T, H, gd, variant == 0 || variant == 2 ? 0 : (lay + 2) % 3, rng, -1, 3),
                gw = make(E, H, wgd, lay, rng, -1, 3);
            TU_CHECK(mxfp8_router_linear_input_grad(&dl.v, &w.v, acc, &gx.v, ws) == MXFP8_OK, "%s: %s", what,
                     mxfp8_last_error_message());
            TU_CHECK(mxfp8_router_linear_weight_grad(&dl.v, &x.v, acc, &gw.v, ws) == MXFP8_OK, "%s: %s", what,
                     mxfp8_last_error_message());
            bad = 0;
            for (int64_t t = 0; t < T; ++t)
                for (int64_t h = 0; h < H; ++h)
                    bad += stored_bits(&gx, t, h) != expect_bits(gd, dxo[t * H + h], gx.val[t * H + h], acc);
            TU_CHECK(bad == 0, "input_grad: %ld elements differ, %s", bad, what);
            bad = 0;
            for (int64_t e = 0; e < E; ++e)
                for (int64_t h = 0; h < H; ++h)
                    bad += stored_bits(&gw, e, h) != expect_bits(wgd, dwo[e * H + h], gw.val[e * H + h], acc);
            TU_CHECK(bad == 0, "weight_grad: %ld elements differ, %s", bad, what);

            /* rows alone (T = 1, 2 or 3 rows at a few offsets) give the batch's bits */
            const int64_t starts[4] = {0, 7, 31, T - 3};
            for (int si = 0; si < 4; ++si)
                for (int64_t n = 1; n <= 3; ++n) {
                    int64_t r0 = starts[si];
                    if (r0 < 0 || r0 + n > T) continue;
                    mxfp8_tensor xs = x.v, ds = dl.v;
                    xs.data = (char *)x.buf + r0 * x.v.strides[0] * (int64_t)mxfp8_dtype_size(xd);
                    ds.data = (char *)dl.buf + r0 * dl.v.strides[0] * (int64_t)mxfp8_dtype_size(dl.v.dtype);
                    xs.shape[0] = ds.shape[0] = n;
                    float l1[3 * 64];
                    float *g1 = tu_alloc((size_t)(n * H + 1) * 4);
                    int64_t sl[2] = {n, E}, sg[2] = {n, H};
                    mxfp8_tensor lv = mxfp8_tensor_make(l1, MXFP8_DTYPE_F32, 2, sl);
                    mxfp8_tensor gv = mxfp8_tensor_make(g1, MXFP8_DTYPE_F32, 2, sg);
                    if (E <= 64) {
                        TU_CHECK(mxfp8_router_linear(&xs, &w.v, bias, &lv, NULL) == MXFP8_OK, "rows alone: %s",
                                 mxfp8_last_error_message());
                        for (int64_t i = 0; i < n * E; ++i)
                            TU_CHECK(tu_f32_bits(l1[i]) == tu_f32_bits(lo[r0 * E + i]),
                                     "logits of rows %lld..+%lld "
                                     "alone differ from the batch's, %s",
                                     (long long)r0, (long long)n, what);
                    }
                    TU_CHECK(mxfp8_router_linear_input_grad(&ds, &w.v, 0, &gv, NULL) == MXFP8_OK, "rows alone: %s",
                             mxfp8_last_error_message());
                    for (int64_t i = 0; i < n * H; ++i)
                        TU_CHECK(tu_f32_bits(g1[i]) == tu_f32_bits(dxo[r0 * H + i]),
                                 "input_grad of rows %lld..+%lld alone differs, %s", (long long)r0, (long long)n, what);
                    free(g1);
                }
            unmake(&lg), unmake(&gx), unmake(&gw);
        }
    }
    mxfp8i_force_ukernel(NULL);
    mxfp8_set_num_threads(0);
    free(lo), free(dxo), free(dwo);
    unmake(&x), unmake(&w), unmake(&b), unmake(&dl);
}

#ifdef HAVE_MXCSR
/* Products of subnormal size (2^-70 x 2^-70): a caller's flush-to-zero / denormals-are-zero must not change them. */
static void mxcsr_case(tu_rng *rng) {
    const int64_t T = 40, H = 70, E = 8;
    mat x = make(T, H, MXFP8_DTYPE_F32, 0, rng, -72, 3), w = make(E, H, MXFP8_DTYPE_F32, 0, rng, -72, 3);
    mat dl = make(T, E, MXFP8_DTYPE_F32, 0, rng, -72, 3);
    float *lo = tu_alloc((size_t)(T * E) * 4), *dxo = tu_alloc((size_t)(T * H) * 4),
          *dwo = tu_alloc((size_t)(E * H) * 4);
    orc_router_logits(x.val, w.val, NULL, T, H, E, lo);
    orc_router_input_grad(dl.val, w.val, T, E, H, dxo);
    orc_router_weight_grad(dl.val, x.val, T, E, H, dwo);
    long sub = 0;
    for (int64_t i = 0; i < T * E; ++i) sub += lo[i] != 0 && fabsf(lo[i]) < 1.17549435e-38f;
    TU_CHECK(sub > T * E / 2, "the case has subnormal logits (%ld)", sub);
    mat lg = make(T, E, MXFP8_DTYPE_F32, 0, rng, 0, 1), gx = make(T, H, MXFP8_DTYPE_F32, 0, rng, 0, 1);
    mat gw = make(E, H, MXFP8_DTYPE_F32, 0, rng, 0, 1);
    unsigned old = _mm_getcsr();
    _mm_setcsr(old | 0x8040u); /* FTZ | DAZ */
    unsigned before = _mm_getcsr();
    mxfp8_status s1 = mxfp8_router_linear(&x.v, &w.v, NULL, &lg.v, NULL);
    mxfp8_status s2 = mxfp8_router_linear_input_grad(&dl.v, &w.v, 0, &gx.v, NULL);
    mxfp8_status s3 = mxfp8_router_linear_weight_grad(&dl.v, &x.v, 0, &gw.v, NULL);
    unsigned after = _mm_getcsr();
    _mm_setcsr(old);
    TU_CHECK(s1 == MXFP8_OK && s2 == MXFP8_OK && s3 == MXFP8_OK, "MXCSR case: %s", mxfp8_last_error_message());
    TU_CHECK((after & 0xFFC0u) == (before & 0xFFC0u), "the caller's MXCSR control bits are restored");
    for (int64_t i = 0; i < T * E; ++i) TU_CHECK(stored_bits(&lg, i / E, i % E) == tu_f32_bits(lo[i]), "FTZ logits");
    for (int64_t i = 0; i < T * H; ++i) TU_CHECK(stored_bits(&gx, i / H, i % H) == tu_f32_bits(dxo[i]), "FTZ dx");
    for (int64_t i = 0; i < E * H; ++i) TU_CHECK(stored_bits(&gw, i / H, i % H) == tu_f32_bits(dwo[i]), "FTZ dw");
    unmake(&x), unmake(&w), unmake(&dl), unmake(&lg), unmake(&gx), unmake(&gw);
    free(lo), free(dxo), free(dwo);
}
#endif

/* A chain of products that round to -0 (-2^-100 * 2^-100) ends at -0: without a bias the logit is -0 (no + 0 that
 * would make it +0); the gradients' chains likewise. */
static void negative_zero(void) {
    float x[2 * 40], w[3 * 40], dl[2 * 3], lg[6], gx[2 * 40], gw[3 * 40];
    for (int i = 0; i < 80; ++i) x[i] = -ldexpf(1.0f, -100);
    for (int i = 0; i < 120; ++i) w[i] = ldexpf(1.0f, -100);
    for (int i = 0; i < 6; ++i) dl[i] = -ldexpf(1.0f, -100);
    int64_t sx[2] = {2, 40}, sw[2] = {3, 40}, sl[2] = {2, 3};
    mxfp8_tensor vx = mxfp8_tensor_make(x, MXFP8_DTYPE_F32, 2, sx), vw = mxfp8_tensor_make(w, MXFP8_DTYPE_F32, 2, sw);
    mxfp8_tensor vl = mxfp8_tensor_make(lg, MXFP8_DTYPE_F32, 2, sl), vd = mxfp8_tensor_make(dl, MXFP8_DTYPE_F32, 2, sl);
    mxfp8_tensor vgx = mxfp8_tensor_make(gx, MXFP8_DTYPE_F32, 2, sx),
                 vgw = mxfp8_tensor_make(gw, MXFP8_DTYPE_F32, 2, sw);
    float want[6];
    orc_router_logits(x, w, NULL, 2, 40, 3, want);
    TU_CHECK(tu_f32_bits(want[0]) == 0x80000000u, "the oracle's chain ends at -0");
    TU_CHECK(mxfp8_router_linear(&vx, &vw, NULL, &vl, NULL) == MXFP8_OK, "%s", mxfp8_last_error_message());
    TU_CHECK(mxfp8_router_linear_input_grad(&vd, &vw, 0, &vgx, NULL) == MXFP8_OK, "%s", mxfp8_last_error_message());
    TU_CHECK(mxfp8_router_linear_weight_grad(&vd, &vx, 0, &vgw, NULL) == MXFP8_OK, "%s", mxfp8_last_error_message());
    for (int i = 0; i < 6; ++i) TU_CHECK(tu_f32_bits(lg[i]) == 0x80000000u, "logits[%d] = %g is not -0", i, lg[i]);
    for (int i = 0; i < 80; ++i) TU_CHECK(tu_f32_bits(gx[i]) == 0x80000000u, "input_grad[%d] is not -0", i);
    for (int i = 0; i < 120; ++i) TU_CHECK(tu_f32_bits(gw[i]) == 0x00000000u, "weight_grad[%d] is not +0", i);
}

#define MSG_HAS(s)                                                                                                     \
    TU_CHECK(strstr(mxfp8_last_error_message(), s) != NULL, "message lacks '%s': %s", s, mxfp8_last_error_message())

static void errors(void) {
    float x[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, w[6] = {1, 0, 0, 1, 1, 1}, b[2] = {10, 20};
    float out[16];
    int64_t sx[2] = {4, 3}, sw[2] = {2, 3}, sb[1] = {2}, so[2] = {4, 2}, s3[3] = {1, 4, 3}, sw4[2] = {2, 4};
    mxfp8_tensor vx = mxfp8_tensor_make(x, MXFP8_DTYPE_F32, 2, sx), vw = mxfp8_tensor_make(w, MXFP8_DTYPE_F32, 2, sw);
    mxfp8_tensor vb = mxfp8_tensor_make(b, MXFP8_DTYPE_F32, 1, sb), vo = mxfp8_tensor_make(out, MXFP8_DTYPE_F32, 2, so);
    mxfp8_tensor vb3 = vb, vo_bf = vo, vo_sh = vo, vo_z = vo, vx3 = mxfp8_tensor_make(x, MXFP8_DTYPE_F32, 3, s3);
    mxfp8_tensor vx_i = vx, vw4 = mxfp8_tensor_make(w, MXFP8_DTYPE_F32, 2, sw4),
                 vo_al = mxfp8_tensor_make(x, MXFP8_DTYPE_F32, 2, so);
    mxfp8_tensor vnull = vx;
    vnull.data = NULL;
    vb3.shape[0] = 3;
    vo_bf.dtype = MXFP8_DTYPE_BF16;
    vo_sh.shape[1] = 3;
    vo_z.strides[0] = 0;
    vx_i.dtype = MXFP8_DTYPE_I32;
    for (int i = 0; i < 16; ++i) out[i] = -7.0f;
    TU_CHECK(mxfp8_router_linear(NULL, &vw, NULL, &vo, NULL) == MXFP8_ERR_NULL_POINTER, "NULL input");
    MSG_HAS("input");
    TU_CHECK(mxfp8_router_linear(&vx, &vw, NULL, NULL, NULL) == MXFP8_ERR_NULL_POINTER, "NULL logits");
    MSG_HAS("logits");
    TU_CHECK(mxfp8_router_linear(&vnull, &vw, NULL, &vo, NULL) == MXFP8_ERR_NULL_POINTER, "NULL data");
    TU_CHECK(mxfp8_router_linear(&vx_i, &vw, NULL, &vo, NULL) == MXFP8_ERR_DTYPE, "input dtype");
    MSG_HAS("input");
    TU_CHECK(mxfp8_router_linear(&vx3, &vw, NULL, &vo, NULL) == MXFP8_ERR_SHAPE_MISMATCH, "input rank");
    TU_CHECK(mxfp8_router_linear(&vx, &vw4, NULL, &vo, NULL) == MXFP8_ERR_SHAPE_MISMATCH, "H differs");
    MSG_HAS("weight");
    TU_CHECK(mxfp8_router_linear(&vx, &vw, &vb3, &vo, NULL) == MXFP8_ERR_SHAPE_MISMATCH, "bias length");
    MSG_HAS("bias");
    TU_CHECK(mxfp8_router_linear(&vx, &vw, &vb, &vo_bf, NULL) == MXFP8_ERR_DTYPE, "logits dtype");
    MSG_HAS("logits");
    TU_CHECK(mxfp8_router_linear(&vx, &vw, &vb, &vo_sh, NULL) == MXFP8_ERR_SHAPE_MISMATCH, "logits shape");
    MSG_HAS("[4, 2]");
    TU_CHECK(mxfp8_router_linear(&vx, &vw, &vb, &vo_z, NULL) == MXFP8_ERR_BAD_STRIDES, "logits zero stride");
    TU_CHECK(mxfp8_router_linear(&vx, &vw, &vb, &vo_al, NULL) == MXFP8_ERR_ALIASING, "logits overlaps input");
    MSG_HAS("input");
    for (int i = 0; i < 16; ++i) TU_CHECK(out[i] == -7.0f, "written on error");
    TU_CHECK(mxfp8_router_linear(&vx, &vw, &vb, &vo, NULL) == MXFP8_OK, "good call: %s", mxfp8_last_error_message());
    /* [[1,2,3],...] @ [[1,0,0],[1,1,1]]^T + [10, 20] */
    const float want[8] = {11, 26, 14, 35, 17, 44, 20, 53};
    for (int i = 0; i < 8; ++i) TU_CHECK(out[i] == want[i], "logits[%d] = %g, expected %g", i, out[i], want[i]);
    TU_CHECK(out[8] == -7.0f, "nothing past logits");

    /* gradients: dl [4, 2] = out, weight [2, 3] */
    float gxb[12], gwb[6];
    for (int i = 0; i < 12; ++i) gxb[i] = -7.0f;
    for (int i = 0; i < 6; ++i) gwb[i] = -7.0f;
    int64_t sgx[2] = {4, 3}, sgw[2] = {2, 3}, sbad[2] = {3, 3};
    mxfp8_tensor vdl = mxfp8_tensor_make(out, MXFP8_DTYPE_F32, 2, so),
                 vgx = mxfp8_tensor_make(gxb, MXFP8_DTYPE_F32, 2, sgx);
    mxfp8_tensor vgw = mxfp8_tensor_make(gwb, MXFP8_DTYPE_F32, 2, sgw),
                 vgx_bad = mxfp8_tensor_make(gxb, MXFP8_DTYPE_F32, 2, sbad);
    mxfp8_tensor vgw_i = vgw, vgx_al = mxfp8_tensor_make(out, MXFP8_DTYPE_F32, 2, sgx), vw_e = vx;
    vgw_i.dtype = MXFP8_DTYPE_I32;
    TU_CHECK(mxfp8_router_linear_input_grad(NULL, &vw, 0, &vgx, NULL) == MXFP8_ERR_NULL_POINTER, "dx: NULL");
    MSG_HAS("logits_grad");
    TU_CHECK(mxfp8_router_linear_input_grad(&vdl, &vw_e, 0, &vgx, NULL) == MXFP8_ERR_SHAPE_MISMATCH, "dx: E differs");
    MSG_HAS("weight");
    TU_CHECK(mxfp8_router_linear_input_grad(&vdl, &vw, 0, &vgx_bad, NULL) == MXFP8_ERR_SHAPE_MISMATCH, "dx: shape");
    MSG_HAS("input_grad");
    TU_CHECK(mxfp8_router_linear_input_grad(&vdl, &vw, 1, &vgx_al, NULL) == MXFP8_ERR_ALIASING, "dx: alias");
    TU_CHECK(mxfp8_router_linear_weight_grad(&vdl, &vx, 0, &vgw_i, NULL) == MXFP8_ERR_DTYPE, "dw: dtype");
    MSG_HAS("weight_grad");
    TU_CHECK(mxfp8_router_linear_weight_grad(&vdl, &vw, 0, &vgw, NULL) == MXFP8_ERR_SHAPE_MISMATCH, "dw: T differs");
    MSG_HAS("input");
    TU_CHECK(mxfp8_router_linear_weight_grad(&vdl, &vx, 0, &vdl, NULL) == MXFP8_ERR_SHAPE_MISMATCH, "dw: shape");
    for (int i = 0; i < 12; ++i) TU_CHECK(gxb[i] == -7.0f, "dx written on error");
    for (int i = 0; i < 6; ++i) TU_CHECK(gwb[i] == -7.0f, "dw written on error");
    /* accumulate adds to the old values: dx = -7 + dl @ w, dw = -7 + dl^T @ x */
    TU_CHECK(mxfp8_router_linear_input_grad(&vdl, &vw, 1, &vgx, NULL) == MXFP8_OK, "dx: %s", mxfp8_last_error_message());
    TU_CHECK(gxb[0] == -7 + 11 + 26 && gxb[1] == -7 + 26 && gxb[2] == -7 + 26, "dx row 0: %g %g %g", gxb[0], gxb[1],
             gxb[2]);
    TU_CHECK(mxfp8_router_linear_weight_grad(&vdl, &vx, 0, &vgw, NULL) == MXFP8_OK, "dw: %s", mxfp8_last_error_message());
    TU_CHECK(gwb[0] == 11 * 1 + 14 * 4 + 17 * 7 + 20 * 10, "dw[0, 0] = %g", gwb[0]);
}

int main(void) {
    tu_rng rng = {20251202};
    /* the F32-panel kernels this CPU can run (the reference always) */
    const mxfp8i_ukernel *kernels[16];
    int nk = 0;
    for (const mxfp8i_ukernel *const *p = mxfp8t_all_ukernels(); *p && nk < 15; ++p)
        if ((*p)->panel == MXFP8I_PANEL_F32 && (*p)->fn && mxfp8i_ukernel_usable(*p)) kernels[nk++] = *p;
    kernels[nk] = NULL;
    TU_CHECK(nk >= 1, "the reference F32 kernel is usable");
    printf("test_router: %d F32-panel kernel(s)\n", nk);
    TU_CHECK(mxfp8_workspace_create(&g_ws) == MXFP8_OK, "workspace_create");

    const shape shapes[] = {{1, 1, 1},   {0, 5, 3},    {3, 0, 4},      {5, 7, 0},     {2, 33, 8},    {9, 31, 9},
                            {33, 64, 8}, {40, 513, 5}, {70, 1100, 17}, {300, 128, 8}, {1100, 40, 8}, {65, 96, 64}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; ++i)
        for (int variant = 0; variant < 6; ++variant) run_case(shapes[i], variant, &rng, kernels);
#ifdef HAVE_MXCSR
    mxcsr_case(&rng);
#endif
    negative_zero();
    errors();
    mxfp8_workspace_destroy(g_ws);
    return tu_finish("test_router");
}
