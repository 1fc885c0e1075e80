"""Codecs against ml_dtypes: every FP8 / E8M0 code decodes as ml_dtypes says; every BF16 value and 2^20 random FP32
values encode to E4M3 / E5M2 as ml_dtypes does for in-range values and saturate beyond.

Two routes reach the codecs: the scalar codec functions (ctypes calls of mxfp8_fp32_to_fp8 etc.), and the public
quantize/dequantize API with scale code 127 (2^0), which runs the fast path unless MXFP8_ISA=scalar.
"""

import ml_dtypes
import numpy as np
import pytest

import mx_oracle as orc
import mxfp8
from mxfp8 import _lib

FMTS = ["e4m3", "e5m2"]
FMT_ID = {"e4m3": 0, "e5m2": 1}


def same_bits(a, b):
    """Bitwise equality of two float arrays of the same dtype (NaN payloads included)."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    u = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    return np.array_equal(a.view(u), b.view(u))


def same_values(a, b):
    """Equal values, NaN equal to NaN, and the same sign of zero."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    both_nan = np.isnan(a) & np.isnan(b)
    eq = (a == b) & (np.signbit(a) == np.signbit(b))
    return bool(np.all(both_nan | eq))


def expected_codes(v32, fmt):
    """Codes the spec demands for float32 values: ml_dtypes on in-range values, saturation of finite overflow,
    NaN -> canonical NaN keeping the sign, +-Inf -> +-Inf (E5M2) / NaN (E4M3)."""
    f = orc.FMT[fmt]
    v32 = np.asarray(v32, np.float32)
    codes = orc.encode(v32, fmt).copy()
    sign = (np.signbit(v32).astype(np.uint8) << 7).astype(np.uint8)
    nan = np.isnan(v32)
    codes[nan] = f["nan"] | sign[nan]
    inf = np.isinf(v32)
    codes[inf] = (0x7F if fmt == "e4m3" else 0x7C) | sign[inf]
    return codes


def scalar_encode(v32, fmt):
    fn = _lib.function("mxfp8_fp32_to_fp8")
    f = FMT_ID[fmt]
    return np.array([fn(float(v), f) for v in np.asarray(v32, np.float32).tolist()], np.uint8)


# ---------------------------------------------------------------------------------------------------------------
# decoding
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FMTS)
def test_all_fp8_codes_decode_scalar(fmt):
    codes = np.arange(256, dtype=np.uint8)
    want = codes.view(orc.FMT[fmt]["dtype"]).astype(np.float32)
    fn = _lib.function("mxfp8_fp8_to_fp32")
    got = np.array([fn(int(c), FMT_ID[fmt]) for c in codes], np.float32)
    assert same_values(got, want)
    assert np.isnan(want).sum() == (2 if fmt == "e4m3" else 6)  # the oracle itself: NaN codes per format


@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("fmt", FMTS)
def test_all_fp8_codes_decode_via_dequantize(fmt, out_dtype):
    """All 256 codes with scale code 127 (x 2^0) through the public dequantize (fast path)."""
    codes = np.arange(256, dtype=np.uint8).reshape(8, 32)
    data = codes.view(orc.FMT[fmt]["dtype"])
    scales = np.full((8, 1), 127, np.uint8)
    got = mxfp8.dequantize(data, scales, axis=-1, out_dtype=out_dtype)
    want = data.astype(np.float32).astype(got.dtype)
    assert got.dtype == np.dtype(ml_dtypes.bfloat16 if out_dtype == "bfloat16" else out_dtype)
    if out_dtype == "float16" and fmt == "e5m2":
        pass  # every E5M2 value is an FP16 value: exact
    assert same_values(got.astype(np.float32), want.astype(np.float32))


def test_all_e8m0_codes_decode_scalar():
    codes = np.arange(256, dtype=np.uint8)
    want = codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    fn = _lib.function("mxfp8_e8m0_to_fp32")
    got = np.array([fn(int(c)) for c in codes], np.float32)
    assert same_values(got, want)
    assert want[0] == np.float32(2.0**-127) and want[254] == np.float32(2.0**127) and np.isnan(want[255])


@pytest.mark.parametrize("fmt", FMTS)
def test_all_e8m0_codes_decode_via_dequantize(fmt):
    """Element 1.0 under every scale code: the dequantized value is the scale itself (255 -> NaN)."""
    one = np.array(1.0, np.float32).astype(orc.FMT[fmt]["dtype"])
    data = np.full((256, 32), one)
    scales = np.arange(256, dtype=np.uint8).reshape(256, 1)
    got = mxfp8.dequantize(data, scales, axis=-1)
    want = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    assert same_values(got, np.repeat(want[:, None], 32, axis=1))


# ---------------------------------------------------------------------------------------------------------------
# encoding: scalar codec
# ---------------------------------------------------------------------------------------------------------------
def all_bf16_as_f32():
    return (np.arange(65536, dtype=np.uint32) << 16).view(np.float32)


def random_f32(n, seed):
    """n random FP32 bit patterns: every exponent, sign and mantissa (incl. subnormals, Inf, NaN)."""
    return np.random.default_rng(seed).integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("fmt", FMTS)
def test_encode_all_bf16_scalar(fmt):
    v = all_bf16_as_f32()
    assert np.array_equal(scalar_encode(v, fmt), expected_codes(v, fmt))


@pytest.mark.parametrize("fmt", FMTS)
def test_encode_random_f32_scalar(fmt):
    v = random_f32(1 << 20, 20260 + FMT_ID[fmt])
    # bias part of them into the interesting range (around the format's span), where the rounding happens
    near = random_f32(1 << 16, 7 + FMT_ID[fmt])
    bits = near.view(np.uint32)
    exp = np.random.default_rng(3).integers(127 - 20, 127 + 18, bits.size).astype(np.uint32)
    near = ((bits & np.uint32(0x807FFFFF)) | (exp << np.uint32(23))).view(np.float32)
    v = np.concatenate([v[: (1 << 20) - near.size], near])
    assert np.array_equal(scalar_encode(v, fmt), expected_codes(v, fmt))


@pytest.mark.parametrize("fmt", FMTS)
def test_encode_saturation_boundaries_scalar(fmt):
    mx = orc.FMT[fmt]["max_normal"]
    top = 65536.0 if fmt == "e5m2" else 512.0  # first value past the last binade
    v = np.array([mx, np.nextafter(np.float32(mx), np.float32(np.inf)), 449, 464, 465, 480, 1000, top, 1e30,
                  3.4e38, 57344, 61439, 61440, 65535, 65536, 1e6], np.float32)
    v = v[v >= mx]
    v = np.concatenate([v, -v])
    got = scalar_encode(v, fmt)
    want = np.where(v > 0, 0x7E if fmt == "e4m3" else 0x7B, 0xFE if fmt == "e4m3" else 0xFB).astype(np.uint8)
    assert np.array_equal(got, want)


# ---------------------------------------------------------------------------------------------------------------
# encoding through quantize with scale code 127 (the fast path unless MXFP8_ISA=scalar)
# ---------------------------------------------------------------------------------------------------------------
def quantize_at_scale_one(v, fmt, dtype):
    """Quantize finite values |v| < 2^(emax+1) with the OCP rule in groups of [anchor 2^emax, 31 values], so that
    every group's exponent is 0 (scale code 127) and each element code is exactly the encoding of the value."""
    emax = orc.FMT[fmt]["emax"]
    n = v.size
    G = -(-n // 31)
    body = np.zeros(G * 31, np.float32)
    body[:n] = v
    x = np.concatenate([np.full((G, 1), 2.0**emax, np.float32), body.reshape(G, 31)], axis=1).astype(dtype)
    data, scales = mxfp8.quantize(x, fmt=fmt, axis=-1, scale_rule="ocp")
    assert np.all(scales == 127)
    return data.view(np.uint8)[:, 1:].reshape(-1)[:n]


@pytest.mark.parametrize("fmt", FMTS)
def test_encode_all_bf16_via_quantize(fmt):
    v = all_bf16_as_f32()
    v = v[np.isfinite(v) & (np.abs(v) < 2.0 ** (orc.FMT[fmt]["emax"] + 1))]
    got = quantize_at_scale_one(v, fmt, ml_dtypes.bfloat16)
    assert np.array_equal(got, expected_codes(v, fmt))


@pytest.mark.parametrize("fmt", FMTS)
def test_encode_random_f32_via_quantize(fmt):
    """2^20 random FP32 values with exponents from 2^-30 up to the scale-1 limit (subnormal outputs, rounding ties
    and the saturation band [max normal, 2^(emax+1)) all included)."""
    emax = orc.FMT[fmt]["emax"]
    rng = np.random.default_rng(99 + FMT_ID[fmt])
    bits = rng.integers(0, 2**32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    exp = rng.integers(127 - 30, 127 + emax + 1, bits.size).astype(np.uint32)
    v = ((bits & np.uint32(0x807FFFFF)) | (exp << np.uint32(23))).view(np.float32)
    got = quantize_at_scale_one(v, fmt, np.float32)
    assert np.array_equal(got, expected_codes(v, fmt))


def test_e5m2_saturation_band_never_inf():
    """Every FP32 value in [57344, 65536) encodes to 57344 (code 0x7B), never Inf -- through quantize."""
    lo = np.array(57344.0, np.float32).view(np.uint32)
    hi = np.array(65536.0, np.float32).view(np.uint32)
    v = np.arange(lo, hi, 37, dtype=np.uint32).view(np.float32)
    v = np.concatenate([v, np.nextafter(np.float32(65536), np.float32(0))[None], -v])
    got = quantize_at_scale_one(v, "e5m2", np.float32)
    assert np.array_equal(got, np.where(v > 0, 0x7B, 0xFB).astype(np.uint8))


def test_expected_codes_oracle_is_not_ml_dtypes_raw():
    """Guard on the oracle: ml_dtypes' raw cast does not saturate, ours does."""
    raw = np.array([465.0, 1000.0], np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert np.all(np.isnan(raw))
    assert np.array_equal(expected_codes(np.array([465.0, 1000.0], np.float32), "e4m3"), [0x7E, 0x7E])
    raw5 = np.array([61440.0], np.float32).astype(ml_dtypes.float8_e5m2).astype(np.float32)
    assert np.isinf(raw5[0])
    assert expected_codes(np.array([61440.0], np.float32), "e5m2")[0] == 0x7B


@pytest.mark.parametrize("fmt", FMTS)
def test_scale_code_function_matches_oracle(fmt, rng):
    """mxfp8_scale_code for random positive amax values (normal and subnormal) against the oracle's rules."""
    fn = _lib.function("mxfp8_scale_code")
    bits = rng.integers(1, 0x7F800000, 20000, dtype=np.uint64).astype(np.uint32)
    amax = bits.view(np.float32)
    amax = np.concatenate([amax, np.array([448, 449, 960, 300, 57344, 57345, 2.0**-149, 3.4028235e38],
                                          np.float32), np.array([0x437FFFFF], np.uint32).view(np.float32)])
    for rule, rid in (("nki", 0), ("ocp", 1), ("rceil", 2)):
        want = np.clip(orc.scale_exponent(amax, fmt, rule), -127, 127) + 127
        got = np.array([fn(float(a), FMT_ID[fmt], rid) for a in amax.tolist()])
        assert np.array_equal(got, want), rule
    assert fn(0.0, FMT_ID[fmt], 0) == 0
    assert fn(float("inf"), FMT_ID[fmt], 0) == 255
    assert fn(float("nan"), FMT_ID[fmt], 1) == 255
