/*
 * test_layouts.c -- scale layouts, x4 packing and the NKI swizzle through the public API: every scale at the position
 * the header's formula gives (written here), unused positions zero, round trips (the 128x4 swizzle also as its flat
 * view); x4 words byte by byte; the swizzle by its tile definition, its inverse, and the agreement of wrapX groups
 * with the swizzle's 8x4 blocks against the tests' independent oracle (tests/c/oracle/); their errors (the right
 * status, outputs untouched).
 */
#include "oracle.h"
#include "runtime/tensor.h"
#include "testutil.h"

/* ---------------------------------------------------------------------------------------------------------- */
/* Scale layouts, x4 packing, NKI swizzle                                                                     */
/* ---------------------------------------------------------------------------------------------------------- */
/* Where the header's formulas (after the NKI and cuBLAS docs) put scale (f, g): the flat offset in a row-major
 * [rows, cols]. */
static int64_t spec_pos(int layout, int64_t F, int64_t G, int64_t f, int64_t g, int64_t cols) {
    (void)F;
    switch (layout) {
    case 0: return f * G + g;
    case 1: return ((g / 4) * 32 + g % 4) * cols + f;
    case 2: return ((g / 64) * 128 + ((g % 64) / 16) * 4 + ((g % 16) / 4) * 32 + g % 4) * cols + f;
    default: {
        int64_t Cp = (G + 3) / 4 * 4;
        return ((f / 128) * (Cp / 4) + g / 4) * 512 + (f % 32) * 16 + ((f % 128) / 32) * 4 + g % 4;
    }
    }
}

static void test_scale_layouts(void) {
    tu_rng rng = {99};
    static const int64_t Fs[] = {1, 127, 129, 160}, Ks[] = {32, 96, 160, 256, 2432};
    for (int layout = 0; layout < 4; layout++)
        for (size_t fi = 0; fi < 4; fi++)
            for (size_t ki = 0; ki < 5; ki++) {
                int64_t F = Fs[fi], K = Ks[ki], G = (K + 31) / 32, shp[2];
                TU_CHECK(mxfp8_scale_layout_shape((mxfp8_scale_layout)layout, F, K, shp) == MXFP8_OK, "shape");
                int64_t want0 = layout == 0   ? F
                                : layout == 1 ? (G + 3) / 4 * 32
                                : layout == 2 ? (K + 2047) / 2048 * 128
                                              : (F + 127) / 128 * 128;
                int64_t want1 = layout == 0 ? G : layout == 3 ? (G + 3) / 4 * 4 : F;
                TU_CHECK(shp[0] == want0 && shp[1] == want1,
                         "layout %d F %lld K %lld: shape [%lld, %lld], want [%lld, "
                         "%lld]",
                         layout, (long long)F, (long long)K, (long long)shp[0], (long long)shp[1], (long long)want0,
                         (long long)want1);
                uint8_t *cmp = tu_alloc((size_t)(F * G)), *back = tu_alloc((size_t)(F * G)),
                        *lay = tu_alloc((size_t)(shp[0] * shp[1]));
                for (int64_t i = 0; i < F * G; i++) cmp[i] = (uint8_t)(1 + tu_next(&rng) % 255);
                memset(lay, 0xCC, (size_t)(shp[0] * shp[1]));
                int64_t cs[2] = {F, G};
                mxfp8_tensor Cm = mxfp8_tensor_make(cmp, MXFP8_DTYPE_E8M0, 2, cs);
                mxfp8_tensor L = mxfp8_tensor_make(lay, MXFP8_DTYPE_U8, 2, shp);
                mxfp8_tensor B = mxfp8_tensor_make(back, MXFP8_DTYPE_E8M0, 2, cs);
                TU_CHECK(mxfp8_scales_to_layout(&Cm, K, (mxfp8_scale_layout)layout, &L) == MXFP8_OK, "to_layout: %s",
                         mxfp8_last_error_message());
                int64_t bad = 0, nonzero = 0;
                for (int64_t f = 0; f < F; f++)
                    for (int64_t g = 0; g < G; g++) bad += lay[spec_pos(layout, F, G, f, g, shp[1])] != cmp[f * G + g];
                for (int64_t i = 0; i < shp[0] * shp[1]; i++) nonzero += lay[i] != 0;
                TU_CHECK(bad == 0, "layout %d F %lld K %lld: %lld scales not where the spec puts them", layout,
                         (long long)F, (long long)K, (long long)bad);
                TU_CHECK(nonzero == F * G, "layout %d F %lld K %lld: %lld non-zero bytes, want %lld (padding zero)",
                         layout, (long long)F, (long long)K, (long long)nonzero, (long long)(F * G));
                memset(back, 0, (size_t)(F * G));
                TU_CHECK(mxfp8_scales_from_layout(&L, K, (mxfp8_scale_layout)layout, &B) == MXFP8_OK, "from_layout: %s",
                         mxfp8_last_error_message());
                TU_CHECK(!memcmp(back, cmp, (size_t)(F * G)), "layout %d F %lld K %lld: round trip differs", layout,
                         (long long)F, (long long)K);
                if (layout == 3) { /* the flat 1-D view of the swizzle */
                    int64_t flat[1] = {shp[0] * shp[1]};
                    mxfp8_tensor L1 = mxfp8_tensor_make(lay, MXFP8_DTYPE_U8, 1, flat);
                    memset(back, 0, (size_t)(F * G));
                    TU_CHECK(mxfp8_scales_from_layout(&L1, K, MXFP8_SCALES_SWIZZLE_128X4, &B) == MXFP8_OK &&
                                 !memcmp(back, cmp, (size_t)(F * G)),
                             "swizzle flat view round trip F %lld K %lld", (long long)F, (long long)K);
                }
                free(cmp), free(back), free(lay);
            }

}

/* x4 packing along each axis of [3, 37, 5]: byte c of word p is element 4p + c, the tail zero; and back. */
static void test_pack_x4(void) {
    tu_rng rng = {98};
    int64_t sh[3] = {3, 37, 5};
    uint8_t codes[3 * 37 * 5], back[3 * 37 * 5];
    for (int i = 0; i < 3 * 37 * 5; i++) codes[i] = (uint8_t)tu_next(&rng);
    for (int ax = 0; ax < 3; ax++) {
        int64_t wsh[3] = {3, 37, 5};
        wsh[ax] = (sh[ax] + 3) / 4;
        uint32_t words[3 * 37 * 5];
        mxfp8_tensor I = mxfp8_tensor_make(codes, MXFP8_DTYPE_E4M3, 3, sh),
                     W = mxfp8_tensor_make(words, MXFP8_DTYPE_U32, 3, wsh),
                     O = mxfp8_tensor_make(back, MXFP8_DTYPE_E4M3, 3, sh);
        TU_CHECK(mxfp8_pack_x4(&I, ax - 3, &W) == MXFP8_OK, "pack_x4 axis %d: %s", ax, mxfp8_last_error_message());
        int64_t idx[3], bad = 0;
        for (idx[0] = 0; idx[0] < wsh[0]; idx[0]++)
            for (idx[1] = 0; idx[1] < wsh[1]; idx[1]++)
                for (idx[2] = 0; idx[2] < wsh[2]; idx[2]++) {
                    uint32_t w = *(uint32_t *)mxfp8i_elem_ptr(&W, idx);
                    for (int c = 0; c < 4; c++) {
                        int64_t e[3] = {idx[0], idx[1], idx[2]};
                        e[ax] = 4 * idx[ax] + c;
                        uint8_t want = e[ax] < sh[ax] ? *(uint8_t *)mxfp8i_elem_ptr(&I, e) : 0;
                        bad += ((w >> (8 * c)) & 0xFF) != want;
                    }
                }
        TU_CHECK(bad == 0, "pack_x4 axis %d: %lld bytes misplaced", ax, (long long)bad);
        memset(back, 0, sizeof back);
        TU_CHECK(mxfp8_unpack_x4(&W, ax, &O) == MXFP8_OK && !memcmp(back, codes, sizeof back),
                 "unpack_x4 axis %d round trip", ax);
    }

}

/* NKI swizzle: definition, round trip, and agreement with wrapX groups (group j of a tile = swizzled rows 8j..8j+7
 * x columns 4f..4f+3, quantized by the oracle). */
static void test_swizzle(void) {
    tu_rng rng = {97};
    static const int64_t Kw[] = {128, 256, 384, 640, 2432};
    for (size_t ki = 0; ki < 5; ki++) {
        int64_t K = Kw[ki], F = 3, G = K / 32;
        float *in = tu_alloc((size_t)(K * F) * 4), *sw = tu_alloc((size_t)(K * F) * 4),
              *un = tu_alloc((size_t)(K * F) * 4);
        tu_fill_random_f32(in, K * F, &rng);
        for (int64_t i = 0; i < K * F; i++)
            if (isnan(in[i]) || isinf(in[i])) in[i] = 1.0f;
        int64_t ps[2] = {K, F}, ss[2] = {K / 4, 4 * F};
        mxfp8_tensor P = mxfp8_tensor_make(in, MXFP8_DTYPE_F32, 2, ps),
                     S = mxfp8_tensor_make(sw, MXFP8_DTYPE_F32, 2, ss),
                     U = mxfp8_tensor_make(un, MXFP8_DTYPE_F32, 2, ps);
        TU_CHECK(mxfp8_swizzle_nki(&P, &S) == MXFP8_OK, "swizzle K %lld: %s", (long long)K, mxfp8_last_error_message());
        /* tiles listed independently: 512s, then a 256 and/or a 128 */
        int64_t bad = 0, k0 = 0;
        while (k0 < K) {
            int64_t Pt = K - k0 >= 512 ? 512 : K - k0 >= 256 ? 256 : 128, St = Pt / 4;
            for (int64_t p = 0; p < St; p++)
                for (int64_t f = 0; f < F; f++)
                    for (int64_t s = 0; s < 4; s++)
                        bad += tu_f32_bits(sw[(k0 / 4 + p) * 4 * F + 4 * f + s]) !=
                               tu_f32_bits(in[(k0 + s * St + p) * F + f]);
            k0 += Pt;
        }
        TU_CHECK(bad == 0, "swizzle K %lld: %lld elements misplaced", (long long)K, (long long)bad);
        TU_CHECK(mxfp8_unswizzle_nki(&S, &U) == MXFP8_OK && !memcmp(un, in, (size_t)(K * F) * 4),
                 "unswizzle K %lld round trip", (long long)K);
        /* wrapX group j of a tile = swizzled rows 8j..8j+7 x columns 4f..4f+3 */
        uint8_t *codes2 = tu_alloc((size_t)(K * F)), *sc2 = tu_alloc((size_t)(G * F));
        tu_quantize_2d(in, MXFP8_DTYPE_F32, K, F, 0,
                    (mxfp8_quant_params){MXFP8_FMT_E4M3, MXFP8_SCALE_OCP, MXFP8_GROUP_WRAPX, MXFP8_ROUND_NEAREST, 0, 0,
                                         NULL},
                    codes2, sc2);
        bad = 0;
        for (int64_t g = 0; g < G; g++)
            for (int64_t f = 0; f < F; f++) {
                double v[32];
                uint8_t cw[32];
                for (int q = 0; q < 8; q++)
                    for (int s = 0; s < 4; s++) v[q * 4 + s] = sw[(8 * g + q) * 4 * F + 4 * f + s];
                bad += orc_quant_group(v, 32, MXFP8_FMT_E4M3, MXFP8_SCALE_OCP, cw) != sc2[g * F + f];
            }
        TU_CHECK(bad == 0, "wrapX K %lld: %lld group scales differ from the swizzle's 8x4 blocks", (long long)K,
                 (long long)bad);
        free(in), free(sw), free(un), free(codes2), free(sc2);
    }
}

/* Errors of the layout, x4 and swizzle calls: the right status, and the output untouched. */
#define SENT 0xA7
static int untouched(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != SENT) return 0;
    return 1;
}
static void test_layout_errors(void) {
    int64_t shp[2];
    TU_CHECK(mxfp8_scale_layout_shape((mxfp8_scale_layout)4, 1, 32, shp) == MXFP8_ERR_INVALID_ARGUMENT, "layout 4");
    TU_CHECK(mxfp8_scale_layout_shape(MXFP8_SCALES_COMPACT, -1, 32, shp) == MXFP8_ERR_SIZE_OVERFLOW, "F -1");
    TU_CHECK(mxfp8_scale_layout_shape(MXFP8_SCALES_COMPACT, 1, 32, NULL) == MXFP8_ERR_NULL_POINTER, "shape NULL");
    uint8_t cm[8 * 4], lay[256 * 4];
    memset(lay, SENT, sizeof lay);
    int64_t cs[2] = {8, 4}, ls[2] = {32, 8};
    mxfp8_tensor Cm = mxfp8_tensor_make(cm, MXFP8_DTYPE_E8M0, 2, cs),
                 L = mxfp8_tensor_make(lay, MXFP8_DTYPE_E8M0, 2, ls);
    TU_CHECK(mxfp8_scales_to_layout(&Cm, 200, MXFP8_SCALES_NKI_UNPACKED, &L) == MXFP8_ERR_SHAPE_MISMATCH, "K vs G");
    TU_CHECK(mxfp8_scales_to_layout(&Cm, 128, MXFP8_SCALES_NKI_PACKED, &L) == MXFP8_ERR_SHAPE_MISMATCH,
             "out shape");
    TU_CHECK(mxfp8_scales_to_layout(&Cm, 128, (mxfp8_scale_layout)-1, &L) == MXFP8_ERR_INVALID_ARGUMENT,
             "layout -1");
    L.dtype = MXFP8_DTYPE_I32;
    TU_CHECK(mxfp8_scales_to_layout(&Cm, 128, MXFP8_SCALES_NKI_UNPACKED, &L) == MXFP8_ERR_DTYPE, "layout dtype");
    TU_CHECK(untouched(lay, sizeof lay), "layout errors wrote output");
    L.dtype = MXFP8_DTYPE_U8;
    TU_CHECK(mxfp8_scales_to_layout(&Cm, 128, MXFP8_SCALES_NKI_UNPACKED, &L) == MXFP8_OK, "layout ok: %s",
             mxfp8_last_error_message());
    uint32_t w[8];
    memset(w, SENT, sizeof w);
    int64_t bs[1] = {30}, ws[1] = {7};
    mxfp8_tensor Bt = mxfp8_tensor_make(cm, MXFP8_DTYPE_E4M3, 1, bs),
                 Wt = mxfp8_tensor_make(w, MXFP8_DTYPE_U32, 1, ws);
    TU_CHECK(mxfp8_pack_x4(&Bt, 0, &Wt) == MXFP8_ERR_SHAPE_MISMATCH, "pack_x4 shape");
    TU_CHECK(mxfp8_pack_x4(&Bt, 1, &Wt) == MXFP8_ERR_INVALID_ARGUMENT, "pack_x4 axis");
    TU_CHECK(untouched((uint8_t *)w, sizeof w), "pack_x4 errors wrote output");
    uint8_t a[100 * 2], b[25 * 8];
    memset(b, SENT, sizeof b);
    int64_t as[2] = {100, 2}, bsh[2] = {25, 8};
    mxfp8_tensor A = mxfp8_tensor_make(a, MXFP8_DTYPE_U8, 2, as), Bs = mxfp8_tensor_make(b, MXFP8_DTYPE_U8, 2, bsh);
    TU_CHECK(mxfp8_swizzle_nki(&A, &Bs) == MXFP8_ERR_UNSUPPORTED, "swizzle K=100");
    TU_CHECK(untouched(b, sizeof b), "swizzle error wrote output");
}

int main(void) {
    test_scale_layouts();
    test_pack_x4();
    test_swizzle();
    test_layout_errors();
    return tu_finish("test_layouts");
}
