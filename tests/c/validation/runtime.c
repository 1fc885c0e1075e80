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
    t = mxfp8_tensor_make(NULL, MXFP8_DTYPE_F32, 99, NULL); /* clamps, never fails */
    TU_CHECK(t.ndim == MXFP8_MAX_DIMS, "tensor_make clamps ndim");
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
