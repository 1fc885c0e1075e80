/* codec.c -- the public scalar codecs (include/mxfp8.h, "Scalar codecs"): thin wrappers of src/format/codec.h. */
#include "codec.h"

uint8_t mxfp8_fp32_to_fp8(float x, mxfp8_format fmt) { return mxfp8i_fp32_to_fp8(x, fmt); }
float mxfp8_fp8_to_fp32(uint8_t code, mxfp8_format fmt) { return mxfp8i_fp8_to_fp32(code, fmt); }
float mxfp8_e8m0_to_fp32(uint8_t code) { return mxfp8i_e8m0_to_fp32(code); }
uint16_t mxfp8_fp32_to_bf16(float x) { return mxfp8i_fp32_to_bf16(x); }
float mxfp8_bf16_to_fp32(uint16_t bits) { return mxfp8i_bf16_to_fp32(bits); }
uint16_t mxfp8_fp32_to_fp16(float x) { return mxfp8i_fp32_to_fp16(x); }
float mxfp8_fp16_to_fp32(uint16_t bits) { return mxfp8i_fp16_to_fp32(bits); }
uint8_t mxfp8_scale_code(float amax, mxfp8_format fmt, mxfp8_scale_rule rule) {
    return mxfp8i_scale_code(amax, fmt, rule);
}
