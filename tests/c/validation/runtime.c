/* runtime.c -- test_validation: threads, info, status and dtype strings, numel, mxfp8_scale_layout_shape. */
#include "harness.h"

static void test_runtime(void) {
    n_cases += 4;
    TU_CHECK(mxfp8_set_num_threads(-2) == MXFP8_ERR_INVALID_ARGUMENT && has_word(mxfp8_last_error_message(), "num_threads"),
             "mxfp8_set_num_threads(-2): %s", mxfp8_last_error_message());
    TU_CHECK(strstr(mxfp8_last_error_message(), "-2") != NULL, "set_num_threads: bad value not shown");
    TU_CHECK(mxfp8_get_info(NULL) == MXFP8_ERR_NULL_POINTER && has_word(mxfp8_last_error_message(), "info"),
             "mxfp8_get_info(NULL): %s", mxfp8_last_error_message());
    /* the message is cleared by the next successful call */
    mxfp8_info in;
    TU_CHECK(mxfp8_get_info(&in) == MXFP8_OK && mxfp8_last_error_message()[0] == 0,
             "a successful call must clear the last error (got \"%s\")", mxfp8_last_error_message());
    TU_CHECK(strcmp(mxfp8_status_string((mxfp8_status)12345), "unknown status") == 0, "status_string(12345)");
    TU_CHECK(mxfp8_dtype_size((mxfp8_dtype)99) == 0 && strcmp(mxfp8_dtype_name((mxfp8_dtype)-1), "?") == 0,
             "unknown dtypes");
    /* numel of hostile views */
    mxfp8_tensor t = mxfp8_tensor_make(NULL, MXFP8_DTYPE_F32, 2, (const int64_t[]){INT64_MAX, 2});
    TU_CHECK(mxfp8_tensor_numel(&t) == -1, "numel overflow");
    t.shape[0] = -1;
    TU_CHECK(mxfp8_tensor_numel(&t) == -1, "numel negative");
    TU_CHECK(mxfp8_tensor_numel(NULL) == -1, "numel NULL");
    t.ndim = 99;
    TU_CHECK(mxfp8_tensor_numel(&t) == -1, "numel ndim 99");
    t = mxfp8_tensor_make(NULL, MXFP8_DTYPE_F32, 99, NULL); /* never fails; keeps the bad ndim for the call to refuse */
    TU_CHECK(t.ndim == 99 && mxfp8_tensor_numel(&t) == -1, "tensor_make keeps an ndim above the maximum");
    t = mxfp8_tensor_make(NULL, MXFP8_DTYPE_F32, -1, NULL);
    TU_CHECK(t.ndim == -1 && mxfp8_tensor_numel(&t) == -1, "tensor_make keeps a negative ndim");
    {   /* an 8-D view used to be clamped to its first 6 extents: quantize then succeeded on half of the tensor */
        float x[64];
        uint8_t d[64], s[2];
        for (int i = 0; i < 64; i++) x[i] = 1.0f + (float)i;
        const int64_t shp[8] = {1, 1, 1, 1, 32, 1, 1, 2}, sshp[8] = {1, 1, 1, 1, 1, 1, 1, 2};
        mxfp8_tensor xv = mxfp8_tensor_make(x, MXFP8_DTYPE_F32, 8, shp);
        mxfp8_tensor dv = mxfp8_tensor_make(d, MXFP8_DTYPE_E4M3, 8, shp);
        mxfp8_tensor sv = mxfp8_tensor_make(s, MXFP8_DTYPE_E8M0, 8, sshp);
        memset(d, 0xAA, sizeof d);
        mxfp8_status st = mxfp8_quantize(&xv, 4, NULL, &dv, &sv);
        int untouched = 1;
        for (int i = 0; i < 64; i++) untouched &= d[i] == 0xAA;
        TU_CHECK(st == MXFP8_ERR_INVALID_ARGUMENT && strstr(mxfp8_last_error_message(), "ndim 8 (must be 0..6)") &&
                     untouched,
                 "an 8-D view is refused with nothing written (got %s: %s)", mxfp8_status_string(st),
                 mxfp8_last_error_message());
    }
    /* mxfp8_scale_layout_shape: scalar arguments only; the output is untouched on error */
    static const struct {
        int layout;
        int64_t F, K;
        mxfp8_status want;
        const char *word;
    } ls[] = {
        {99, 4, 64, MXFP8_ERR_INVALID_ARGUMENT, "layout"},
        {-1, 4, 64, MXFP8_ERR_INVALID_ARGUMENT, "layout"},
        {MXFP8_SCALES_COMPACT, -1, 64, MXFP8_ERR_SIZE_OVERFLOW, "F"},
        {MXFP8_SCALES_NKI_UNPACKED, 4, -64, MXFP8_ERR_SIZE_OVERFLOW, "K"},
        {MXFP8_SCALES_SWIZZLE_128X4, INT64_MAX, INT64_MAX, MXFP8_ERR_SIZE_OVERFLOW, NULL},
        {MXFP8_SCALES_NKI_PACKED, INT64_MAX / 2, INT64_MAX, MXFP8_ERR_SIZE_OVERFLOW, NULL},
    };
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) {
        int64_t shp[2] = {-7, -7};
        n_cases++;
        mxfp8_status st = mxfp8_scale_layout_shape((mxfp8_scale_layout)ls[i].layout, ls[i].F, ls[i].K, shp);
        const char *msg = mxfp8_last_error_message();
        TU_CHECK(st == ls[i].want, "mxfp8_scale_layout_shape case %zu: status %d, want %d (%s)", i, (int)st,
                 (int)ls[i].want, msg);
        TU_CHECK(!ls[i].word || has_word(msg, ls[i].word), "mxfp8_scale_layout_shape case %zu: '%s' not named: %s",
                 i, ls[i].word, msg);
        TU_CHECK(shp[0] == -7 && shp[1] == -7, "mxfp8_scale_layout_shape case %zu wrote its output on error", i);
    }
    n_cases++;
    TU_CHECK(mxfp8_scale_layout_shape(MXFP8_SCALES_COMPACT, 4, 64, NULL) == MXFP8_ERR_NULL_POINTER &&
                 has_word(mxfp8_last_error_message(), "shape"),
             "mxfp8_scale_layout_shape(NULL): %s", mxfp8_last_error_message());
}

void validation_runtime(void) {
    test_runtime();
}
