/*
 * fuzz_quantize.c -- libFuzzer target: mxfp8_quantize / mxfp8_dequantize on arbitrary bytes.
 *
 * The first 7 bytes choose the call: rank (1..3), extents, axis (sometimes out of range), element format, scale
 * rule and group scheme (each sometimes an unknown value), source dtype (F32/BF16/F16), a negative stride, the
 * scales dtype, a data dtype that disagrees with the format, a wrong scales shape, and 1 or 2 threads. The rest are
 * the source values' raw bits (repeated to fill the tensor), so NaN, Inf, subnormals and huge values all occur.
 * Checked:
 *  - an invalid call returns an error and writes nothing (outputs keep their sentinel bytes); a valid one succeeds;
 *  - the codes and scales equal the scalar reference group quantizer (mxfp8i_quantize_group_ref, the executable
 *    specification) group by group, whichever ISA path ran;
 *  - mxfp8_dequantize of the result equals the reference group dequantizer bit for bit.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/codec.h"
#include "format/groups.h"
#include "kernels/avx512/avx512.h"
#include "kernels/qpanel.h"
#include "kernels/ref/ref.h"
#include "kernels/registry.h"
#include "quant/panel.h"
#include "runtime/tensor.h"
#include "fuzz_assert.h"


#define MAXN 6144
#define SENT 0xA5

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    mxfp8_set_num_threads(1);
    return 0;
}

static float load(const mxfp8_tensor *t, const int64_t *idx) {
    int64_t off = 0;
    for (int i = 0; i < t->ndim; i++) off += idx[i] * t->strides[i];
    return mxfp8i_load_f32(t->data, t->dtype, off);
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    if (n < 7) return 0;
    const int ndim = 1 + d[0] % 3;
    int64_t shape[3] = {1, 1, 1};
    for (int i = 0; i < ndim; i++) shape[i] = 1 + d[1 + i] % 80;
    int axis = (d[4] & 0x80) ? (int)(int8_t)d[4] % 8 : d[4] % ndim;
    int fmt = d[5] % 3, rule = (d[5] >> 2) % 4, group = (d[5] >> 4) % 3;
    static const mxfp8_dtype sdt[4] = {MXFP8_DTYPE_F32, MXFP8_DTYPE_BF16, MXFP8_DTYPE_F16, MXFP8_DTYPE_F32};
    const mxfp8_dtype src_dtype = sdt[d[5] >> 6];
    const int neg_stride = d[6] & 1, scales_u8 = d[6] & 2, data_wrong = (d[6] & 0x1C) == 0x1C,
              scales_wrong = (d[6] & 0x60) == 0x60, two_threads = d[6] & 0x80;
    int ax = -1;
    int axis_ok = mxfp8i_norm_axis(axis, ndim, &ax);
    if (axis_ok && group == MXFP8_GROUP_WRAPX && (d[3] & 1)) shape[ax] = 128 * (1 + (d[3] >> 1) % 2);
    int64_t numel = shape[0] * shape[1] * shape[2];
    while (numel > MAXN) { /* shrink the largest non-axis extent */
        int big = -1;
        for (int i = 0; i < ndim; i++)
            if (i != ax && shape[i] > 1 && (big < 0 || shape[i] > shape[big])) big = i;
        if (big < 0) break;
        shape[big] = (shape[big] + 1) / 2;
        numel = shape[0] * shape[1] * shape[2];
    }
    const size_t es = mxfp8_dtype_size(src_dtype);
    const uint8_t *bits = d + 7;
    const size_t nbits = n - 7;
    uint8_t *src = malloc((size_t)numel * es);
    for (size_t i = 0; i < (size_t)numel * es; i++) src[i] = nbits ? bits[i % nbits] : 0;

    mxfp8_tensor s = mxfp8_tensor_make(src, src_dtype, ndim, shape);
    if (neg_stride && shape[0] > 1) { /* the same elements, rows in reverse order */
        s.data = src + (size_t)((shape[0] - 1) * s.strides[0]) * es;
        s.strides[0] = -s.strides[0];
    }
    const int fmt_ok = fmt <= 1, rule_ok = rule <= 2, group_ok = group <= 1;
    const mxfp8_format f = fmt_ok ? (mxfp8_format)fmt : MXFP8_FMT_E4M3;
    mxfp8_dtype ddt = mxfp8i_fmt_dtype(f);
    if (data_wrong) ddt = ddt == MXFP8_DTYPE_E4M3 ? MXFP8_DTYPE_E5M2 : MXFP8_DTYPE_E4M3;
    uint8_t *codes = malloc((size_t)numel), *scales = malloc((size_t)numel + 64);
    memset(codes, SENT, (size_t)numel);
    memset(scales, SENT, (size_t)numel + 64);
    mxfp8_tensor dt = mxfp8_tensor_make(codes, ddt, ndim, shape);
    int64_t sshape[3] = {shape[0], shape[1], shape[2]};
    const int a2 = axis_ok ? ax : 0;
    sshape[a2] = (shape[a2] + 31) / 32 + (scales_wrong ? 1 : 0);
    mxfp8_tensor sc = mxfp8_tensor_make(scales, scales_u8 ? MXFP8_DTYPE_U8 : MXFP8_DTYPE_E8M0, ndim, sshape);
    mxfp8_quant_params qp = {(mxfp8_format)fmt, (mxfp8_scale_rule)rule, (mxfp8_group_scheme)group};
    mxfp8_set_num_threads(two_threads ? 2 : 1);
    mxfp8_status st = mxfp8_quantize(&s, axis, &qp, &dt, &sc);

    const int valid = axis_ok && fmt_ok && rule_ok && group_ok && !data_wrong && !scales_wrong &&
                      !(group == MXFP8_GROUP_WRAPX && shape[ax] % 128 != 0);
    if (!valid) {
        FUZZ_ASSERT(st != MXFP8_OK, "an invalid call succeeded (axis %d fmt %d rule %d group %d)", axis, fmt, rule,
                    group);
        FUZZ_ASSERT(mxfp8_last_error_message()[0] != 0, "an error without a message");
        for (int64_t i = 0; i < numel; i++) FUZZ_ASSERT(codes[i] == SENT, "data written on error");
        for (int64_t i = 0; i < numel + 64; i++) FUZZ_ASSERT(scales[i] == SENT, "scales written on error");
    } else {
        FUZZ_ASSERT(st == MXFP8_OK, "a valid call failed: %s", mxfp8_last_error_message());
        const int64_t K = shape[ax], G = (K + 31) / 32;
        float *deq = malloc((size_t)numel * sizeof(float));
        memset(deq, SENT, (size_t)numel * sizeof(float));
        mxfp8_tensor out = mxfp8_tensor_make(deq, MXFP8_DTYPE_F32, ndim, shape);
        st = mxfp8_dequantize(&dt, &sc, ax, (mxfp8_group_scheme)group, &out);
        FUZZ_ASSERT(st == MXFP8_OK, "dequantize failed: %s", mxfp8_last_error_message());
        int64_t idx[3] = {0, 0, 0};
        int64_t lim[3] = {shape[0], shape[1], shape[2]};
        lim[ax] = 1;
        for (idx[0] = 0; idx[0] < lim[0]; idx[0]++)
            for (idx[1] = 0; idx[1] < lim[1]; idx[1]++)
                for (idx[2] = 0; idx[2] < lim[2]; idx[2]++)
                    for (int64_t g = 0; g < G; g++) {
                        int64_t mem[32], j[3] = {idx[0], idx[1], idx[2]};
                        int m = mxfp8i_group_members(K, (mxfp8_group_scheme)group, g, mem);
                        float x[32], y[32];
                        uint8_t want[32];
                        for (int q = 0; q < m; q++) {
                            j[ax] = mem[q];
                            x[q] = load(&s, j);
                        }
                        uint8_t scale = mxfp8i_quantize_group_ref(x, m, f, (mxfp8_scale_rule)rule, want);
                        mxfp8i_dequantize_group_ref(want, m, scale, f, y);
                        j[ax] = g;
                        int64_t so = 0;
                        for (int i = 0; i < ndim; i++) so += j[i] * sc.strides[i];
                        FUZZ_ASSERT(scales[so] == scale, "scale of group %lld: %u, reference %u", (long long)g,
                                    scales[so], scale);
                        for (int q = 0; q < m; q++) {
                            j[ax] = mem[q];
                            int64_t o = 0;
                            for (int i = 0; i < ndim; i++) o += j[i] * dt.strides[i];
                            FUZZ_ASSERT(codes[o] == want[q], "code of element %lld: 0x%02x, reference 0x%02x",
                                        (long long)mem[q], codes[o], want[q]);
                            uint32_t a, b;
                            memcpy(&a, &deq[o], 4);
                            memcpy(&b, &y[q], 4);
                            FUZZ_ASSERT(a == b || (isnan(deq[o]) && isnan(y[q])),
                                        "dequantized element %lld: 0x%08x, reference 0x%08x", (long long)mem[q], a, b);
                        }
                    }
        free(deq);
    }
    free(src);
    free(codes);
    free(scales);
    return 0;
}
