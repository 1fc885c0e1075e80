/* layouts.c -- test_validation: scale layouts, x4 packing and the NKI swizzle. */
#include "harness.h"

static void dq_axis(fx *f) { f->axis = 5; } /* as quant.c: axis 5 */
/* ======================================================================================================== */
/* layouts, x4 packing, swizzle (once implemented)                                                           */
/* ======================================================================================================== */
static mxfp8_status call_to_layout(fx *f) {
    return mxfp8_scales_to_layout(f->tp[0], f->K, f->layout, f->tp[1]);
}
static void setup_to_layout(fx *f) {
    f->fn = "mxfp8_scales_to_layout";
    f->call = call_to_layout;
    f->K = 96;
    f->layout = MXFP8_SCALES_NKI_UNPACKED;
    int64_t shp[2];
    mxfp8_scale_layout_shape(f->layout, 5, f->K, shp);
    add(f, "compact", MXFP8_DTYPE_E8M0, 2, 5, 3, 0, 0, F_BYPTR);
    add(f, "out", MXFP8_DTYPE_E8M0, 2, shp[0], shp[1], 0, 0, F_BYPTR | F_OUT);
}
static void l_layout(fx *f) { f->layout = (mxfp8_scale_layout)17; }
static void l_K(fx *f) { f->K = -32; }
static const special sp_to_layout[] = {
    {"layout 17", l_layout, MXFP8_ERR_INVALID_ARGUMENT, "layout", "17"},
    {"K negative", l_K, MXFP8_ERR_SIZE_OVERFLOW, "K", "-32"},
};
static mxfp8_status call_from_layout(fx *f) {
    return mxfp8_scales_from_layout(f->tp[0], f->K, f->layout, f->tp[1]);
}
static void setup_from_layout(fx *f) {
    f->fn = "mxfp8_scales_from_layout";
    f->call = call_from_layout;
    f->K = 96;
    f->layout = MXFP8_SCALES_NKI_UNPACKED;
    int64_t shp[2];
    mxfp8_scale_layout_shape(f->layout, 5, f->K, shp);
    add(f, "in", MXFP8_DTYPE_E8M0, 2, shp[0], shp[1], 0, 0, F_BYPTR);
    add(f, "compact", MXFP8_DTYPE_U8, 2, 5, 3, 0, 0, F_BYPTR | F_OUT);
}
static mxfp8_status call_pack(fx *f) { return mxfp8_pack_x4(f->tp[0], f->axis, f->tp[1]); }
static void setup_pack(fx *f) {
    f->fn = "mxfp8_pack_x4";
    f->call = call_pack;
    add(f, "in", MXFP8_DTYPE_E4M3, 2, 3, 12, 0, 0, F_BYPTR);
    add(f, "out", MXFP8_DTYPE_U32, 2, 3, 3, 0, 0, F_BYPTR | F_OUT);
    f->axis = 1;
}
static const special sp_pack[] = {{"axis 2", dq_axis, MXFP8_ERR_INVALID_ARGUMENT, "axis", "5"}};
static mxfp8_status call_unpack(fx *f) { return mxfp8_unpack_x4(f->tp[0], f->axis, f->tp[1]); }
static void setup_unpack(fx *f) {
    f->fn = "mxfp8_unpack_x4";
    f->call = call_unpack;
    add(f, "in", MXFP8_DTYPE_U32, 2, 3, 3, 0, 0, F_BYPTR);
    add(f, "out", MXFP8_DTYPE_E4M3, 2, 3, 12, 0, 0, F_BYPTR | F_OUT);
    f->axis = 1;
}
static mxfp8_status call_swz(fx *f) { return mxfp8_swizzle_nki(f->tp[0], f->tp[1]); }
static void setup_swz(fx *f) {
    f->fn = "mxfp8_swizzle_nki";
    f->call = call_swz;
    f->extent_alt = MXFP8_ERR_UNSUPPORTED; /* K + 1 is not a multiple of 128 */
    add(f, "in", MXFP8_DTYPE_E4M3, 2, 128, 3, 0, 0, F_BYPTR);
    add(f, "out", MXFP8_DTYPE_E4M3, 2, 32, 12, 0, 0, F_BYPTR | F_OUT);
}
static mxfp8_status call_unswz(fx *f) { return mxfp8_unswizzle_nki(f->tp[0], f->tp[1]); }
static void setup_unswz(fx *f) {
    f->fn = "mxfp8_unswizzle_nki";
    f->call = call_unswz;
    f->extent_alt = MXFP8_ERR_UNSUPPORTED;
    add(f, "in", MXFP8_DTYPE_E4M3, 2, 32, 12, 0, 0, F_BYPTR);
    add(f, "out", MXFP8_DTYPE_E4M3, 2, 128, 3, 0, 0, F_BYPTR | F_OUT);
}
static const special sp_none[] = {{"axis 5", dq_axis, MXFP8_OK, NULL, NULL}};

void validation_layouts(void) {
    RUN("mxfp8_scales_to_layout", setup_to_layout, sp_to_layout);
    RUN("mxfp8_scales_from_layout", setup_from_layout, sp_to_layout);
    RUN("mxfp8_pack_x4", setup_pack, sp_pack);
    RUN("mxfp8_unpack_x4", setup_unpack, sp_pack);
    run_fixture("mxfp8_swizzle_nki", setup_swz, sp_none, 0);
    run_fixture("mxfp8_unswizzle_nki", setup_unswz, sp_none, 0);
}
