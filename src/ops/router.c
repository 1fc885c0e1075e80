/*
 * router.c -- the batch-invariant linear of an MoE router (include/mxfp8.h, "Router linear"):
 *   mxfp8_router_linear              logits[t, e] = chain_h(x[t, h] * w[e, h]) (+ bias[e])
 *   mxfp8_router_linear_input_grad   dx[t, h]     = chain_e(dlogits[t, e] * w[e, h])
 *   mxfp8_router_linear_weight_grad  dw[e, h]     = chain_t(dlogits[t, e] * x[t, h])
 * each chain one FP32 fmaf per step from +0 in ascending order of its index, so an element's bits depend on its own
 * operands only: not on the batch it is computed in, the thread count or the ISA path.
 *
 * The chains run on the registry's F32-panel GEMM microkernel (mxfp8i_f32_ukernel: the reference or the AVX-512F
 * kernel, which reproduce each other bit for bit; src/kernels/ukernel.h's contract is exactly such a chain per
 * element, and splitting the contraction into chunks with load_c is exact). No quantization: the operands are
 * packed as FP32 values (BF16 / FP16 widened exactly). Rows past the tensor's end in a panel are zeros, which touch
 * only the padded outputs, never stored. Threads split tiles of outputs (tokens for the forward and the input
 * gradient, hidden columns for the weight gradient), never a chain. The packed operand and the threads' scratch are
 * slots of the caller's workspace (src/runtime/workspace.h), obtained after the checks and before the first store.
 */
#include <stdlib.h>
#include <string.h>

#include "../format/codec.h"
#include "../kernels/registry.h"
#include "../runtime/error.h"
#include "../runtime/fenv.h"
#include "../runtime/tensor.h"
#include "../runtime/threads.h"
#include "../runtime/workspace.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#define MR MXFP8I_MR /* rows of an A panel (8) */
#define NR MXFP8I_NR /* columns of a B panel (32) */
#define KC 512       /* contraction steps per panel chunk (a multiple of 16: chunks stay 64-byte aligned) */

/* A 2-D operand: element (r, c) at base[(r * rs + c * cs) * size]. */
typedef struct mat {
    const char *base;
    mxfp8_dtype dt;
    int64_t rs, cs;
} mat;

static mat mat_of(const mxfp8_tensor *t) {
    mat m = {(const char *)t->data, t->dtype, t->strides[0], t->strides[1]};
    return m;
}

/* dst[j * ds] = m(r, c0 + j) as FP32 (exact widening) for j < n. */
static void load_seg(const mat *m, int64_t r, int64_t c0, int64_t n, float *dst, int64_t ds) {
    const int64_t off = r * m->rs + c0 * m->cs, cs = m->cs;
    if (m->dt == MXFP8_DTYPE_F32) {
        const float *p = (const float *)m->base + off;
        if (cs == 1 && ds == 1) memcpy(dst, p, (size_t)n * sizeof(float));
        else
            for (int64_t j = 0; j < n; ++j) dst[j * ds] = p[j * cs];
    } else if (m->dt == MXFP8_DTYPE_BF16) {
        const uint16_t *p = (const uint16_t *)m->base + off;
        if (cs == 1)
            for (int64_t j = 0; j < n; ++j) dst[j * ds] = mxfp8i_bf16_to_fp32(p[j]);
        else
            for (int64_t j = 0; j < n; ++j) dst[j * ds] = mxfp8i_bf16_to_fp32(p[j * cs]);
    } else {
        const uint16_t *p = (const uint16_t *)m->base + off;
        for (int64_t j = 0; j < n; ++j) dst[j * ds] = mxfp8i_fp16_to_fp32(p[j * cs]);
    }
}

/* panel[(k - k0) * w + i] = m(r0 + i, k) for i < rows, k in [k0, k0 + kc); lanes rows..w-1 zero. BF16 rows with unit
 * column stride go through the registry's transposing BF16 load (the MoE checkpoints'); else in steps of 64 k, so
 * that the panel lines being filled stay in the L1 cache across the rows. */
static void pack_rows(const mat *m, int64_t r0, int rows, int64_t k0, int64_t kc, int w, float *panel) {
    if (rows < w) memset(panel, 0, (size_t)(kc * w) * sizeof(float));
    if (m->dt == MXFP8_DTYPE_BF16 && m->cs == 1) {
        const uint16_t *src = (const uint16_t *)m->base + r0 * m->rs + k0;
        mxfp8i_kernels_get()->quant->bf16_t(src, m->rs, panel, w, rows, kc);
        return;
    }
    if (m->dt == MXFP8_DTYPE_F32 && m->cs == 1) { /* blocks of 8 rows x 8 k, transposed through registers */
        const float *src = (const float *)m->base + r0 * m->rs + k0;
        const int64_t rs = m->rs;
        int i0 = 0;
        for (; i0 + 8 <= rows; i0 += 8) {
            int64_t k = 0;
            for (; k + 8 <= kc; k += 8) {
                float t[8][8];
                for (int i = 0; i < 8; ++i)
                    for (int j = 0; j < 8; ++j) t[i][j] = src[(i0 + i) * rs + k + j];
                for (int j = 0; j < 8; ++j)
                    for (int i = 0; i < 8; ++i) panel[(k + j) * w + i0 + i] = t[i][j];
            }
            for (; k < kc; ++k)
                for (int i = 0; i < 8; ++i) panel[k * w + i0 + i] = src[(i0 + i) * rs + k];
        }
        for (int i = i0; i < rows; ++i)
            for (int64_t k = 0; k < kc; ++k) panel[k * w + i] = src[i * rs + k];
        return;
    }
    for (int64_t kb = 0; kb < kc; kb += 64) {
        const int64_t n = kc - kb < 64 ? kc - kb : 64;
        for (int i = 0; i < rows; ++i) load_seg(m, r0 + i, k0 + kb, n, panel + kb * w + i, w);
    }
}

/* panel[(k - k0) * w + j] = m(k, c0 + j) for j < cols, k in [k0, k0 + kc); lanes cols..w-1 zero. */
static void pack_cols(const mat *m, int64_t c0, int cols, int64_t k0, int64_t kc, int w, float *panel) {
    if (cols == NR && w == NR && m->cs == 1 && m->dt != MXFP8_DTYPE_F16) { /* full panels: fixed-width copies */
        if (m->dt == MXFP8_DTYPE_F32) {
            const float *src = (const float *)m->base + k0 * m->rs + c0;
            for (int64_t k = 0; k < kc; ++k)
                for (int j = 0; j < NR; ++j) panel[k * NR + j] = src[k * m->rs + j];
        } else {
            const uint16_t *src = (const uint16_t *)m->base + k0 * m->rs + c0;
            for (int64_t k = 0; k < kc; ++k)
                for (int j = 0; j < NR; ++j) panel[k * NR + j] = mxfp8i_bf16_to_fp32(src[k * m->rs + j]);
        }
        return;
    }
    for (int64_t k = 0; k < kc; ++k) {
        float *p = panel + k * w;
        load_seg(m, k0 + k, c0, cols, p, 1);
        for (int j = cols; j < w; ++j) p[j] = 0.0f;
    }
}

static int imin(int64_t a, int64_t b) { return (int)(a < b ? a : b); }

/* 64-byte aligned scratch of n floats: slot `slot` of the open workspace scope (NULL on overflow or failure). */
static float *ws_floats(int slot, int64_t n) {
    int64_t bytes;
    if (!mxfp8i_mul_size(n < 16 ? 16 : n, (int64_t)sizeof(float), &bytes)) return NULL;
    bytes = mxfp8i_round_up(bytes, 64);
    if ((uint64_t)bytes > (uint64_t)SIZE_MAX) return NULL;
    return (float *)mxfp8i_ws_get(slot, (size_t)bytes);
}

/* A call's scratch: opens *scope on the caller's workspace and takes nbuf buffers from the router's slots before the
 * first store: the packed operand (n[0] floats), the threads' scratch (n[1]) and, with nbuf = 3, the bias (n[2]);
 * each at least 16 floats, so that an empty operand still has a valid pointer. On OUT_OF_MEMORY the scope is closed
 * again. */
static mxfp8_status take_scratch(const char *fn, mxfp8_workspace *workspace, mxfp8i_scope *scope, int nbuf,
                                 const int64_t n[3], float *buf[3]) {
    MXFP8I_RETURN_ERROR_IF(mxfp8i_scope_begin(scope, workspace), MXFP8_ERR_OUT_OF_MEMORY,
                           "%s: cannot allocate a workspace", fn);
    static const int slots[3] = {MXFP8I_WS_ROUTER_PANELS, MXFP8I_WS_ROUTER_SCRATCH, MXFP8I_WS_ROUTER_BIAS};
    int ok = 1;
    for (int i = 0; i < nbuf; i++) ok = (buf[i] = ws_floats(slots[i], n[i])) != NULL && ok;
    if (ok) return MXFP8_OK;
    mxfp8i_scope_end(scope);
    return mxfp8i_error(MXFP8_ERR_OUT_OF_MEMORY, "%s: out of memory for %lld floats of packed operands", fn,
                        (long long)(n[0] + n[1]));
}

/* Threads for `work` multiply-adds split over `tiles` units (the bits do not depend on it). */
static int threads_for(double work, int64_t tiles) {
    if (work < 262144.0 || tiles < 2) return 1;
    int nt = mxfp8i_num_threads();
    return nt > tiles ? (int)tiles : nt;
}

/* ---- validation ---------------------------------------------------------------------------------------------- */

static mxfp8_status check_in(const char *fn, const char *name, const mxfp8_tensor *t) {
    MXFP8I_RETURN_ERROR_IF(!t, MXFP8_ERR_NULL_POINTER, "%s: %s is NULL", fn, name);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_rank(fn, name, t, 2));
    return mxfp8i_check_dtype(fn, name, t, 3, MXFP8_DTYPE_F32, MXFP8_DTYPE_BF16, MXFP8_DTYPE_F16);
}

static mxfp8_status check_out(const char *fn, const char *name, const mxfp8_tensor *t, int64_t rows, int64_t cols,
                              const char *what) {
    MXFP8I_RETURN_ERROR_IF(!t, MXFP8_ERR_NULL_POINTER, "%s: %s is NULL", fn, name);
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_rank(fn, name, t, 2));
    char buf[96];
    MXFP8I_RETURN_ERROR_IF(t->shape[0] != rows || t->shape[1] != cols, MXFP8_ERR_SHAPE_MISMATCH,
                           "%s: %s has shape %s, expected [%lld, %lld] (%s)", fn, name,
                           mxfp8i_shape_str(t, buf, sizeof buf), (long long)rows, (long long)cols, what);
    return mxfp8i_check_distinct(fn, name, t);
}

/* ---- forward ------------------------------------------------------------------------------------------------- */

mxfp8_status mxfp8_router_linear(const mxfp8_tensor *input, const mxfp8_tensor *weight, const mxfp8_tensor *bias,
                                 mxfp8_tensor *logits, mxfp8_workspace *workspace) {
    static const char *fn = "mxfp8_router_linear";
    mxfp8i_clear_error();
    MXFP8I_FORWARD_IF_ERROR(check_in(fn, "input", input));
    MXFP8I_FORWARD_IF_ERROR(check_in(fn, "weight", weight));
    const int64_t T = input->shape[0], H = input->shape[1], E = weight->shape[0];
    MXFP8I_RETURN_ERROR_IF(weight->shape[1] != H, MXFP8_ERR_SHAPE_MISMATCH,
                           "%s: weight [E, H] = [%lld, %lld] does not match input [T, H] = [%lld, %lld] (H differs)",
                           fn, (long long)E, (long long)weight->shape[1], (long long)T, (long long)H);
    const int has_bias = bias && bias->data;
    if (has_bias) MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_bias(fn, bias, E, "E", "weight's rows"));
    MXFP8I_FORWARD_IF_ERROR(check_out(fn, "logits", logits, T, E, "[T, E]: input's rows, weight's rows"));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_dtype(fn, "logits", logits, 1, MXFP8_DTYPE_F32));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_no_alias(fn, "logits", logits, "input", input));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_no_alias(fn, "logits", logits, "weight", weight));
    if (has_bias) MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_no_alias(fn, "logits", logits, "bias", bias));
    if (T == 0 || E == 0) return MXFP8_OK;

    const mxfp8i_ukernel *uk = mxfp8i_f32_ukernel();
    const int64_t EP = mxfp8i_ceil_div(E, MR), tiles = mxfp8i_ceil_div(T, NR), kc_max = H < KC ? H : KC;
    const int nt = threads_for((double)T * (double)E * (double)H, tiles);
    const int64_t wlen = mxfp8i_round_up(H, 2) * MR;     /* one expert panel (64-byte multiple) */
    const int64_t per = kc_max * NR + EP * MR * NR + 16; /* a thread's B chunk and C tiles */
    int64_t wn, sn;
    MXFP8I_RETURN_ERROR_IF(!mxfp8i_mul_size(EP, wlen, &wn) || !mxfp8i_mul_size(nt, per, &sn), MXFP8_ERR_SIZE_OVERFLOW,
                           "%s: the packed weight of [%lld, %lld] does not fit in memory", fn, (long long)E,
                           (long long)H);
    mxfp8i_scope scope;
    float *buf[3];
    MXFP8I_FORWARD_IF_ERROR(take_scratch(fn, workspace, &scope, 3, (const int64_t[3]){wn, sn, EP * MR}, buf));
    float *wp = buf[0], *scratch = buf[1], *bv = buf[2];
    const mat x = mat_of(input), w = mat_of(weight);
    for (int64_t e = 0; e < EP * MR; ++e)
        bv[e] = has_bias && e < E ? mxfp8i_load_f32(bias->data, bias->dtype, e * bias->strides[0]) : 0.0f;
    for (int64_t p = 0; p < EP; ++p) pack_rows(&w, p * MR, imin(E - p * MR, MR), 0, H, MR, wp + p * wlen);
    float *out = (float *)logits->data;
    const int64_t ors = logits->strides[0], ocs = logits->strides[1];
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t q = 0; q < tiles; ++q) {
        unsigned csr = mxfp8i_fenv_enter();
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        float *xb = scratch + tid * per, *ct = xb + kc_max * NR;
        const int64_t t0 = q * NR;
        const int nr = imin(T - t0, NR);
        if (H == 0) memset(ct, 0, (size_t)(EP * MR * NR) * sizeof(float));
        for (int64_t k0 = 0; k0 < H; k0 += KC) {
            const int64_t kc = H - k0 < KC ? H - k0 : KC;
            pack_rows(&x, t0, nr, k0, kc, NR, xb);
            for (int64_t p = 0; p < EP; ++p)
                uk->fn(kc, wp + p * wlen + k0 * MR, xb, ct + p * MR * NR, NR, imin(E - p * MR, MR), nr, k0 > 0);
        }
        /* ct[e * NR + j] = chain of token t0 + j, expert e; the bias is added once, in FP32 */
        for (int j = 0; j < nr; ++j)
            for (int64_t e = 0; e < E; ++e) /* no bias: the chain as it is (a -0 stays -0) */
                out[(t0 + j) * ors + e * ocs] = has_bias ? ct[e * NR + j] + bv[e] : ct[e * NR + j];
        mxfp8i_fenv_leave(csr);
    }
    mxfp8i_scope_end(&scope);
    return MXFP8_OK;
}

/* ---- gradients ----------------------------------------------------------------------------------------------- */

/* Store an FP32 tile row: dst element j = v[j] (or old + v[j] in FP32), rounded once (RNE) to dst's dtype. One loop
 * per dtype and mode, which the compiler vectorizes. */
static void store_row(const mxfp8_tensor *dst, int64_t r, int64_t c0, int64_t n, const float *v, int accumulate) {
    const int64_t off = r * dst->strides[0] + c0 * dst->strides[1], cs = dst->strides[1];
    if (dst->dtype == MXFP8_DTYPE_F32) {
        float *p = (float *)dst->data + off;
        if (accumulate)
            for (int64_t j = 0; j < n; ++j) p[j * cs] = p[j * cs] + v[j];
        else if (cs == 1) memcpy(p, v, (size_t)n * sizeof(float));
        else
            for (int64_t j = 0; j < n; ++j) p[j * cs] = v[j];
    } else if (dst->dtype == MXFP8_DTYPE_BF16) {
        uint16_t *p = (uint16_t *)dst->data + off;
        if (accumulate)
            for (int64_t j = 0; j < n; ++j) p[j * cs] = mxfp8i_fp32_to_bf16(mxfp8i_bf16_to_fp32(p[j * cs]) + v[j]);
        else
            for (int64_t j = 0; j < n; ++j) p[j * cs] = mxfp8i_fp32_to_bf16(v[j]);
    } else {
        uint16_t *p = (uint16_t *)dst->data + off;
        if (accumulate)
            for (int64_t j = 0; j < n; ++j) p[j * cs] = mxfp8i_fp32_to_fp16(mxfp8i_fp16_to_fp32(p[j * cs]) + v[j]);
        else
            for (int64_t j = 0; j < n; ++j) p[j * cs] = mxfp8i_fp32_to_fp16(v[j]);
    }
}

mxfp8_status mxfp8_router_linear_input_grad(const mxfp8_tensor *logits_grad, const mxfp8_tensor *weight, int accumulate,
                                            mxfp8_tensor *input_grad, mxfp8_workspace *workspace) {
    static const char *fn = "mxfp8_router_linear_input_grad";
    mxfp8i_clear_error();
    MXFP8I_FORWARD_IF_ERROR(check_in(fn, "logits_grad", logits_grad));
    MXFP8I_FORWARD_IF_ERROR(check_in(fn, "weight", weight));
    const int64_t T = logits_grad->shape[0], E = logits_grad->shape[1], H = weight->shape[1];
    MXFP8I_RETURN_ERROR_IF(weight->shape[0] != E, MXFP8_ERR_SHAPE_MISMATCH,
                           "%s: weight [E, H] = [%lld, %lld] does not match logits_grad [T, E] = [%lld, %lld] (E "
                           "differs)",
                           fn, (long long)weight->shape[0], (long long)H, (long long)T, (long long)E);
    MXFP8I_FORWARD_IF_ERROR(
        check_out(fn, "input_grad", input_grad, T, H, "[T, H]: logits_grad's rows, weight's columns"));
    MXFP8I_FORWARD_IF_ERROR(
        mxfp8i_check_dtype(fn, "input_grad", input_grad, 3, MXFP8_DTYPE_F32, MXFP8_DTYPE_BF16, MXFP8_DTYPE_F16));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_no_alias(fn, "input_grad", input_grad, "logits_grad", logits_grad));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_no_alias(fn, "input_grad", input_grad, "weight", weight));
    if (T == 0 || H == 0) return MXFP8_OK;

    const mxfp8i_ukernel *uk = mxfp8i_f32_ukernel();
    const int64_t HP = mxfp8i_ceil_div(H, NR), tiles = mxfp8i_ceil_div(T, MR);
    const int nt = threads_for((double)T * (double)E * (double)H, tiles);
    const int64_t wlen = (E > 0 ? E : 1) * NR;                   /* one panel of W^T: 32 columns of h, E steps */
    const int64_t alen = mxfp8i_round_up(E > 0 ? E : 1, 2) * MR; /* a thread's A panel (8 rows of dlogits) */
    int64_t wn, sn, strip;
    MXFP8I_RETURN_ERROR_IF(!mxfp8i_mul_size(HP, wlen, &wn) || !mxfp8i_mul_size(MR, H, &strip) ||
                               !mxfp8i_mul_size(nt, alen + strip, &sn),
                           MXFP8_ERR_SIZE_OVERFLOW, "%s: the packed weight of [%lld, %lld] does not fit in memory", fn,
                           (long long)E, (long long)H);
    mxfp8i_scope scope;
    float *buf[3];
    MXFP8I_FORWARD_IF_ERROR(take_scratch(fn, workspace, &scope, 2, (const int64_t[3]){wn, sn, 0}, buf));
    float *wp = buf[0], *scratch = buf[1];
    const mat dl = mat_of(logits_grad), w = mat_of(weight);
    for (int64_t p = 0; p < HP; ++p) pack_cols(&w, p * NR, imin(H - p * NR, NR), 0, E, NR, wp + p * wlen);
    /* FP32 rows with unit column stride, no accumulation: the kernel writes input_grad itself; BF16 rows likewise:
       8 rows of FP32 chains, then the registry's FP32 -> BF16 rounding (the GEMM epilogue's); else store_row */
    const int unit = input_grad->strides[1] == 1 && !accumulate;
    const int direct = E > 0 && unit && input_grad->dtype == MXFP8_DTYPE_F32;
    const int to_bf16 = unit && input_grad->dtype == MXFP8_DTYPE_BF16;
    const mxfp8i_to_bf16_fn cvt = mxfp8i_kernels_get()->quant->to_bf16;
    const int64_t grs = input_grad->strides[0];
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t q = 0; q < tiles; ++q) {
        unsigned csr = mxfp8i_fenv_enter();
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        float *a = scratch + tid * (alen + strip), *rows = a + alen;
        const int64_t t0 = q * MR;
        const int mr = imin(T - t0, MR);
        float *c = direct ? (float *)input_grad->data + t0 * grs : rows;
        const int64_t ldc = direct ? grs : H;
        if (E > 0) {
            pack_rows(&dl, t0, mr, 0, E, MR, a);
            for (int64_t p = 0; p < HP; ++p) uk->fn(E, a, wp + p * wlen, c + p * NR, ldc, mr, imin(H - p * NR, NR), 0);
        } else if (!direct) {
            memset(rows, 0, (size_t)(mr * H) * sizeof(float));
        }
        if (to_bf16) cvt(rows, H, (uint16_t *)input_grad->data + t0 * grs, grs, mr, H);
        else if (!direct)
            for (int i = 0; i < mr; ++i) store_row(input_grad, t0 + i, 0, H, rows + i * H, accumulate);
        mxfp8i_fenv_leave(csr);
    }
    mxfp8i_scope_end(&scope);
    return MXFP8_OK;
}

mxfp8_status mxfp8_router_linear_weight_grad(const mxfp8_tensor *logits_grad, const mxfp8_tensor *input, int accumulate,
                                             mxfp8_tensor *weight_grad, mxfp8_workspace *workspace) {
    static const char *fn = "mxfp8_router_linear_weight_grad";
    mxfp8i_clear_error();
    MXFP8I_FORWARD_IF_ERROR(check_in(fn, "logits_grad", logits_grad));
    MXFP8I_FORWARD_IF_ERROR(check_in(fn, "input", input));
    const int64_t T = logits_grad->shape[0], E = logits_grad->shape[1], H = input->shape[1];
    MXFP8I_RETURN_ERROR_IF(input->shape[0] != T, MXFP8_ERR_SHAPE_MISMATCH,
                           "%s: input [T, H] = [%lld, %lld] does not match logits_grad [T, E] = [%lld, %lld] (T "
                           "differs)",
                           fn, (long long)input->shape[0], (long long)H, (long long)T, (long long)E);
    MXFP8I_FORWARD_IF_ERROR(
        check_out(fn, "weight_grad", weight_grad, E, H, "[E, H]: logits_grad's columns, input's columns"));
    MXFP8I_FORWARD_IF_ERROR(
        mxfp8i_check_dtype(fn, "weight_grad", weight_grad, 3, MXFP8_DTYPE_F32, MXFP8_DTYPE_BF16, MXFP8_DTYPE_F16));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_no_alias(fn, "weight_grad", weight_grad, "logits_grad", logits_grad));
    MXFP8I_FORWARD_IF_ERROR(mxfp8i_check_no_alias(fn, "weight_grad", weight_grad, "input", input));
    if (E == 0 || H == 0) return MXFP8_OK;

    const mxfp8i_ukernel *uk = mxfp8i_f32_ukernel();
    const int64_t EP = mxfp8i_ceil_div(E, MR), tiles = mxfp8i_ceil_div(H, NR), kc_max = T < KC ? T : KC;
    const int nt = threads_for((double)T * (double)E * (double)H, tiles);
    const int64_t alen = mxfp8i_round_up(T > 0 ? T : 1, 2) * MR; /* one panel of dlogits^T: 8 experts, T steps */
    const int64_t per = (kc_max > 0 ? kc_max : 1) * NR + EP * MR * NR + 16;
    int64_t an, sn;
    MXFP8I_RETURN_ERROR_IF(!mxfp8i_mul_size(EP, alen, &an) || !mxfp8i_mul_size(nt, per, &sn), MXFP8_ERR_SIZE_OVERFLOW,
                           "%s: the packed logits_grad of [%lld, %lld] does not fit in memory", fn, (long long)T,
                           (long long)E);
    mxfp8i_scope scope;
    float *buf[3];
    MXFP8I_FORWARD_IF_ERROR(take_scratch(fn, workspace, &scope, 2, (const int64_t[3]){an, sn, 0}, buf));
    float *ap = buf[0], *scratch = buf[1];
    const mat dl = mat_of(logits_grad), x = mat_of(input);
    for (int64_t p = 0; p < EP; ++p) pack_cols(&dl, p * MR, imin(E - p * MR, MR), 0, T, MR, ap + p * alen);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t q = 0; q < tiles; ++q) {
        unsigned csr = mxfp8i_fenv_enter();
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        float *xb = scratch + tid * per, *ct = xb + (kc_max > 0 ? kc_max : 1) * NR;
        const int64_t h0 = q * NR;
        const int nr = imin(H - h0, NR);
        if (T == 0) memset(ct, 0, (size_t)(EP * MR * NR) * sizeof(float));
        for (int64_t k0 = 0; k0 < T; k0 += KC) {
            const int64_t kc = T - k0 < KC ? T - k0 : KC;
            pack_cols(&x, h0, nr, k0, kc, NR, xb);
            for (int64_t p = 0; p < EP; ++p)
                uk->fn(kc, ap + p * alen + k0 * MR, xb, ct + p * MR * NR, NR, imin(E - p * MR, MR), nr, k0 > 0);
        }
        for (int64_t e = 0; e < E; ++e) store_row(weight_grad, e, h0, nr, ct + e * NR, accumulate);
        mxfp8i_fenv_leave(csr);
    }
    mxfp8i_scope_end(&scope);
    return MXFP8_OK;
}
