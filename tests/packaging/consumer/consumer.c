/* consumer.c -- a program outside the project that uses an installed libmxfp8: built through the pkg-config file
 * and through find_package(mxfp8) by tests/packaging/test_install.py. Quantizes 64 values to E4M3 and back and
 * prints "consumer: ok <version> <largest error>" (exit 0), or the library's message (exit 1). */
#include <math.h>
#include <stdio.h>

#include <mxfp8.h>

int main(void) {
    float x[64], y[64];
    uint8_t codes[64], scales[2];
    for (int i = 0; i < 64; i++) x[i] = (float)(i - 20) * 0.37f;
    int64_t shape[1] = {64}, sshape[1] = {2};
    mxfp8_tensor src = mxfp8_tensor_make(x, MXFP8_DTYPE_F32, 1, shape);
    mxfp8_tensor data = mxfp8_tensor_make(codes, MXFP8_DTYPE_E4M3, 1, shape);
    mxfp8_tensor sc = mxfp8_tensor_make(scales, MXFP8_DTYPE_E8M0, 1, sshape);
    mxfp8_tensor out = mxfp8_tensor_make(y, MXFP8_DTYPE_F32, 1, shape);
    mxfp8_quant_params qp = mxfp8_quant_params_default();
    if (mxfp8_quantize(&src, 0, &qp, &data, &sc) != MXFP8_OK ||
        mxfp8_dequantize(&data, &sc, 0, MXFP8_GROUP_1X32, &out) != MXFP8_OK) {
        fprintf(stderr, "consumer: %s\n", mxfp8_last_error_message());
        return 1;
    }
    double err = 0;
    for (int i = 0; i < 64; i++) err = fmax(err, fabs((double)y[i] - x[i]) / fmax(fabs((double)x[i]), 1e-30));
    printf("consumer: ok %s %.4f\n", mxfp8_version_string(), err);
    return err <= 0.0625 ? 0 : 1; /* E4M3 keeps 3 mantissa bits: relative error <= 2^-4 for normal values */
}
