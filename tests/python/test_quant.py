"""MX quantization through the public Python API against the independent oracle (mx_oracle.py), the specific cases
of the OCP MX v1.0 rules, scale layouts, x4 packing, the NKI swizzle, errors and runtime controls.

CI runs this file twice: with the fast path and with MXFP8_ISA=scalar.
"""

import os
import pickle

import ml_dtypes
import numpy as np
import pytest

import mx_oracle as orc
import mxfp8
from mxfp8 import _lib

FMTS = ["e4m3", "e5m2"]
RULES = ["nki", "ocp", "rceil"]
DTYPES = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}
F8 = {"e4m3": np.dtype(ml_dtypes.float8_e4m3fn), "e5m2": np.dtype(ml_dtypes.float8_e5m2)}


def bits(a):
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def spread(rng, shape, dtype):
    """Random values spanning many magnitudes: a base exponent per line of the last axis plus a per-element offset
    (so groups along either axis mix binades and produce FP8 subnormals and underflow), 1/8 of the elements with an
    exponent anywhere in the dtype's range (FP32 subnormals included for F32/BF16), 1/16 exact zeros, random signs."""
    if dtype == np.float16:
        lo, hi = -24, 15
    else:
        lo, hi = -140, 120
    base = rng.integers(lo + 22, hi - 4, size=shape[:-1] + (1,))
    e = base + rng.integers(-20, 3, size=shape)
    wild = rng.random(shape) < 1 / 8
    e = np.where(wild, rng.integers(lo, hi, size=shape), e)
    m = 1 + rng.random(shape)
    x = np.ldexp(m, e) * np.where(rng.random(shape) < 0.5, -1, 1)
    x = np.where(rng.random(shape) < 1 / 16, 0.0, x)
    if dtype == np.float16:
        x = np.clip(x, -65504, 65504)
    return x.astype(np.float32).astype(dtype)


def check_against_oracle(x, fmt, axis, rule, group):
    data, scales = mxfp8.quantize(x, fmt=fmt, axis=axis, scale_rule=rule, group=group)
    want_codes, want_scales = orc.quantize(x, fmt, axis, rule, group)
    assert data.dtype == F8[fmt] and data.shape == x.shape
    assert scales.dtype == np.uint8 and scales.shape == want_scales.shape
    assert np.array_equal(scales, want_scales), f"scales differ at {np.argwhere(scales != want_scales)[:5]}"
    bad = np.argwhere(bits(data) != want_codes)
    assert bad.size == 0, (f"codes differ at {bad[:5].tolist()}: got {bits(data)[tuple(bad[0])]:#x} "
                           f"want {want_codes[tuple(bad[0])]:#x} for x={x[tuple(bad[0])]}")
    return data, scales


CASES_1X32 = [((64, 96), -1), ((96, 40), 0), ((3, 33, 70), 1), ((5, 4, 129), -1), ((31, 6, 2), 0)]
CASES_WRAPX = [((16, 896), -1), ((640, 3), 0), ((2, 256, 5), 1), ((3, 2, 128), -1), ((384, 2, 2), 0)]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("group", ["1x32", "wrapx"])
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("fmt", FMTS)
def test_quantize_matches_oracle(fmt, rule, group, dtype, rng):
    for shape, axis in CASES_1X32 if group == "1x32" else CASES_WRAPX:
        x = spread(rng, shape, DTYPES[dtype])
        data, scales = check_against_oracle(x, fmt, axis, rule, group)
        # dequantize(quantize(x)) equals the oracle's exact dequantization
        got = mxfp8.dequantize(data, scales, axis=axis, group=group)
        want = orc.dequantize(bits(data), scales, fmt, axis, group, np.float32)
        assert np.array_equal(bits(got), bits(want))


@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("group", ["1x32", "wrapx"])
@pytest.mark.parametrize("fmt", FMTS)
def test_dequantize_matches_oracle(fmt, group, out_dtype, rng):
    shape, axis = ((24, 384), -1) if group == "wrapx" else ((24, 100), -1)
    for ax in (axis, 0):
        if group == "wrapx" and ax == 0:
            shape = (384, 24)
        x = spread(rng, shape, np.float32)
        # scales across the whole E8M0 range (incl. 0, 254 and 255) on random codes
        data, scales = mxfp8.quantize(x, fmt=fmt, axis=ax, group=group)
        scales = rng.integers(0, 256, size=scales.shape).astype(np.uint8)
        codes = rng.integers(0, 256, size=shape).astype(np.uint8)
        with np.errstate(over="ignore"):
            got = mxfp8.dequantize(codes.view(F8[fmt]), scales, axis=ax, group=group, out_dtype=out_dtype)
            want = orc.dequantize(codes, scales, fmt, ax, group, got.dtype)
        nan = np.isnan(want.astype(np.float32))
        assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
        assert np.array_equal(bits(got)[~nan], bits(want)[~nan])


@pytest.mark.parametrize("group", ["1x32", "wrapx"])
def test_large_arrays_match_oracle(group, rng):
    """Arrays big enough to be split between threads and to run the wide SIMD loops (rows and columns)."""
    x = spread(rng, (136, 2560), ml_dtypes.bfloat16)
    for fmt, rule, axis in (("e4m3", "nki", -1), ("e5m2", "rceil", -1), ("e4m3", "ocp", 0), ("e5m2", "nki", 0)):
        if group == "wrapx" and axis == 0:
            continue  # 136 is not a multiple of 128
        check_against_oracle(x, fmt, axis, rule, group)
    xf = spread(rng, (1024, 96), np.float32)
    check_against_oracle(xf, "e4m3", 0, "rceil", group)


@pytest.mark.parametrize("L", [1, 31, 33, 127, 129])
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("fmt", FMTS)
def test_axis_lengths(fmt, rule, L, rng):
    for dtype in DTYPES.values():
        x = spread(rng, (7, L), dtype)
        check_against_oracle(x, fmt, -1, rule, "1x32")
        check_against_oracle(np.ascontiguousarray(x.T), fmt, 0, rule, "1x32")


def test_strided_views(rng):
    """Non-contiguous inputs (transposed, negative and step strides) quantize like their contiguous copies."""
    base = spread(rng, (70, 130), np.float32)
    for x in (base.T, base[::-1, ::2], base[5:60:3, ::-1], base.astype(ml_dtypes.bfloat16)[::2].T):
        for axis in (0, -1):
            for rule in RULES:
                d1, s1 = mxfp8.quantize(x, axis=axis, scale_rule=rule)
                d2, s2 = mxfp8.quantize(np.ascontiguousarray(x), axis=axis, scale_rule=rule)
                assert np.array_equal(bits(d1), bits(d2)) and np.array_equal(s1, s2)
                check_against_oracle(x, "e4m3", axis, rule, "1x32")


@pytest.mark.parametrize("group", ["1x32", "wrapx"])
def test_transpose_equivalence(group, rng):
    """Quantizing X^T along rows equals quantizing X along columns, transposed, bit for bit."""
    x = spread(rng, (256, 160), ml_dtypes.bfloat16)
    for fmt in FMTS:
        d_rows, s_rows = mxfp8.quantize(np.ascontiguousarray(x.T), fmt=fmt, axis=-1, group=group)
        d_cols, s_cols = mxfp8.quantize(x, fmt=fmt, axis=0, group=group)
        assert np.array_equal(bits(d_rows), bits(d_cols).T)
        assert np.array_equal(s_rows, s_cols.T)


# ---------------------------------------------------------------------------------------------------------------
# the specific cases of the OCP MX v1.0 / NKI rules
# ---------------------------------------------------------------------------------------------------------------
def one_group(values, fmt="e4m3", rule="nki", dtype=np.float32):
    x = np.zeros(32, np.float32)
    x[: len(values)] = values
    data, scales = mxfp8.quantize(x.astype(dtype), fmt=fmt, scale_rule=rule)
    assert scales.shape == (1,)
    return data, int(scales[0])


def test_amax_960():
    data, s = one_group([960.0, 1.0], "e4m3", "ocp")
    assert s == 128 and float(data[0]) == 448.0  # 960 / 2 = 480 saturates to max normal, never NaN
    data, s = one_group([960.0, 1.0], "e4m3", "rceil")
    assert s == 129 and float(data[0]) == 240.0  # 960 / 4 = 240 exactly
    assert float(mxfp8.dequantize(data, np.array([s], np.uint8))[0]) == 960.0
    data, s = one_group([960.0, 1.0], "e4m3", "nki")
    assert s == 129 and float(data[0]) == 240.0


def test_amax_300_ocp_e4m3():
    data, s = one_group([300.0, -2.5], "e4m3", "ocp")
    assert s == 127 and float(data[0]) == 288.0 and float(data[1]) == -2.5


def test_amax_449_rceil():
    data, s = one_group([449.0], "e4m3", "rceil")
    assert s == 128 and float(data[0]) == 224.0  # 224.5 rounds to even
    _, s = one_group([448.0], "e4m3", "rceil")
    assert s == 127


def test_amax_bits_437fffff_ocp():
    a = np.array([0x437FFFFF], np.uint32).view(np.float32)[0]
    data, s = one_group([a], "e4m3", "ocp")
    assert s == 126 and float(data[0]) == 448.0  # 511.99997 saturates


def test_ocp_scaled_values_saturate_never_nan():
    # amax in [256, 512) under OCP/E4M3 gives e = 0: the scaled values are the values themselves
    data, s = one_group([449.0, 464.0, 465.0, 511.0, -465.0], "e4m3", "ocp")
    assert s == 127
    assert [float(v) for v in data[:5]] == [448.0, 448.0, 448.0, 448.0, -448.0]
    data, s = one_group([1000.0], "e4m3", "ocp")  # 1000 / 2 = 500
    assert s == 128 and float(data[0]) == 448.0
    # the scalar codec on the scaled values themselves
    fn = _lib.function("mxfp8_fp32_to_fp8")
    assert [fn(v, 0) for v in (449.0, 464.0, 465.0, 1000.0)] == [0x7E] * 4


def test_e5m2_band_never_inf():
    vals = [57344.0, 57345.0, 60000.0, 61439.0, 61440.0, 65535.0, -61440.0]
    data, s = one_group(vals, "e5m2", "ocp")
    assert s == 127
    got = data[: len(vals)].astype(np.float32)
    assert np.all(np.isfinite(got)) and list(got) == [57344.0] * 6 + [-57344.0]


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("rule", RULES)
def test_zero_nan_inf_groups(fmt, rule, rng):
    x = spread(rng, (4, 160), np.float32)
    x[0, 32:64] = 0.0                  # all-zero group among non-zero ones
    x[1, 64:96] = -0.0
    x[2, 0:32] = 1.0
    x[2, 7] = np.nan                   # a group with a NaN
    x[2, 40] = -np.inf                 # a group with -Inf
    x[3, 130] = np.inf                 # a short last group... (160 = 5 full groups) with +Inf
    x[3, 131] = -3.0
    data, scales = check_against_oracle(x, fmt, -1, rule, "1x32")
    assert scales[0, 1] == 0 and scales[1, 2] == 0
    assert np.all(data[0, 32:64].astype(np.float32) == 0) and np.all(data[1, 64:96].astype(np.float32) == 0)
    nan_code = 0x7F if fmt == "e4m3" else 0x7E
    assert scales[2, 0] == 255 and scales[2, 1] == 255 and scales[3, 4] == 255
    assert np.all(bits(data)[2, 0:32] == nan_code)                 # positive values -> +NaN
    assert bits(data)[2, 40] == 0x80 | nan_code                    # -Inf -> NaN with the sign, never hidden
    assert bits(data)[3, 130] == nan_code and bits(data)[3, 131] == 0x80 | nan_code
    assert np.all(scales[0, [0, 2, 3, 4]] != 255)                  # other groups untouched
    y = mxfp8.dequantize(data, scales)
    assert np.all(np.isnan(y[2, 0:64])) and np.all(np.isnan(y[3, 128:160]))
    assert np.all(y[0, 32:64] == 0) and not np.any(np.isnan(y[0, :32]))


def test_padding_never_enters_amax():
    """A short last group (length 33 -> groups of 32 and 1): the lone value sets its own scale."""
    x = np.zeros(33, np.float32)
    x[:32] = 1000.0
    x[32] = 0.5
    data, scales = mxfp8.quantize(x, scale_rule="nki")
    assert list(scales) == [129, 119]  # 1000: floor(log2) 9 - 7 = 2; 0.5: -1 - 7 = -8
    assert float(data[32]) == 128.0


def test_wrapx_group_membership():
    """wrapX along a 128-long axis: group j = {32s + 8j + q}; a single large value raises only its group's scale."""
    for j in range(4):
        for s in range(4):
            x = np.ones(128, np.float32)
            x[32 * s + 8 * j + 3] = 256.0
            _, scales = mxfp8.quantize(x, group="wrapx")
            want = [120] * 4
            want[j] = 128
            assert list(scales) == want, (j, s)


# ---------------------------------------------------------------------------------------------------------------
# scale layouts, x4 packing, NKI swizzle
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["compact", "nki_unpacked", "nki_packed", "swizzle_128x4"])
def test_scale_layouts(layout, rng):
    for F in (1, 127, 129, 160):
        for K in (32, 96, 160, 256, 2432):
            G = -(-K // 32)
            compact = rng.integers(1, 255, size=(F, G)).astype(np.uint8)  # non-zero: padding shows as 0
            want = orc.to_layout(compact, K, layout)
            assert mxfp8.scale_layout_shape(layout, F, K) == want.shape
            got = mxfp8.to_scale_layout(compact, K, layout)
            assert got.shape == want.shape and np.array_equal(got, want), (F, K)
            rows = F if layout == "swizzle_128x4" else None
            back = mxfp8.from_scale_layout(got, K, layout, rows=rows)
            assert np.array_equal(back, compact), (F, K)


def test_scale_layout_of_real_quantization(rng):
    """Scales of an actual quantization round-trip through every layout."""
    x = spread(rng, (129, 2432), ml_dtypes.bfloat16)
    _, scales = mxfp8.quantize(x, axis=-1)
    for layout in ("nki_unpacked", "nki_packed", "swizzle_128x4"):
        lay = mxfp8.to_scale_layout(scales, 2432, layout)
        assert np.array_equal(mxfp8.from_scale_layout(lay, 2432, layout, rows=129), scales)


@pytest.mark.parametrize("fmt", FMTS)
def test_pack_x4(fmt, rng):
    for shape, axis in [((3, 8), -1), ((5, 9), -1), ((7, 2), 0), ((1, 1), -1), ((4, 6, 11), 1), ((2, 5, 3), 0)]:
        codes = rng.integers(0, 256, size=shape).astype(np.uint8).view(F8[fmt])
        words = mxfp8.pack_x4(codes, axis=axis)
        assert words.dtype == np.uint32
        assert np.array_equal(words, orc.pack_x4(codes, axis)), (shape, axis)
        back = mxfp8.unpack_x4(words, shape[axis], axis=axis, fmt=fmt)
        assert back.dtype == F8[fmt] and np.array_equal(bits(back), bits(codes))
    # contiguous along the last axis: little-endian words are just the bytes
    codes = rng.integers(0, 256, size=(4, 64)).astype(np.uint8)
    assert np.array_equal(mxfp8.pack_x4(codes.view(F8[fmt])), codes.view("<u4"))


@pytest.mark.parametrize("K", [128, 256, 384, 512, 640, 896, 1024])
def test_swizzle_nki(K, rng):
    for dtype in (np.uint8, ml_dtypes.float8_e4m3fn, ml_dtypes.bfloat16, np.float32):
        x = rng.integers(0, 256, size=(K, 6)).astype(np.uint8).astype(np.float32).astype(dtype)
        sw = mxfp8.swizzle_nki(x)
        assert sw.dtype == x.dtype and sw.shape == (K // 4, 24)
        assert np.array_equal(bits(sw), bits(orc.swizzle_nki(x)))
        assert np.array_equal(bits(mxfp8.unswizzle_nki(sw)), bits(x))


# ---------------------------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------------------------
def test_bad_option_strings_raise_value_error():
    x = np.ones((2, 32), np.float32)
    d, s = mxfp8.quantize(x)
    for kwargs, param in [(dict(fmt="e3m4"), "fmt"), (dict(scale_rule="floor"), "scale_rule"),
                          (dict(group="2x16"), "group")]:
        with pytest.raises(ValueError, match=f"^{param}: unknown value"):
            mxfp8.quantize(x, **kwargs)
    with pytest.raises(ValueError, match="^out_dtype"):
        mxfp8.dequantize(d, s, out_dtype="int8")
    with pytest.raises(ValueError, match="^group"):
        mxfp8.dequantize(d, s, group="wrap")
    with pytest.raises(ValueError, match="^layout"):
        mxfp8.to_scale_layout(s, 32, "quadrants")
    with pytest.raises(ValueError, match="^axis"):
        mxfp8.quantize(x, axis=2)
    with pytest.raises(ValueError, match="^axis"):
        mxfp8.dequantize(d, s, axis=-3)
    with pytest.raises(ValueError, match="^fmt"):
        mxfp8.dequantize(d, s, fmt="e5m2")  # disagrees with the data's dtype


def test_python_numbers_become_float32():
    d, s = mxfp8.quantize([[1, 2, 3], [0.5, -0.25, 7.0]])
    d32, s32 = mxfp8.quantize(np.array([[1, 2, 3], [0.5, -0.25, 7.0]], np.float32))
    assert np.array_equal(bits(d), bits(d32)) and np.array_equal(s, s32)


def test_options_are_case_insensitive_and_accept_dtypes():
    x = np.linspace(-3, 3, 256, dtype=np.float32).reshape(2, 128)
    a = mxfp8.quantize(x, fmt="E5M2", scale_rule="OCP", group="wrapX")
    b = mxfp8.quantize(x, fmt=ml_dtypes.float8_e5m2, scale_rule="ocp", group="wrapx")
    assert np.array_equal(bits(a[0]), bits(b[0])) and np.array_equal(a[1], b[1])
    y = mxfp8.dequantize(a[0], a[1], group="wrapx", out_dtype=ml_dtypes.bfloat16)
    assert y.dtype == np.dtype(ml_dtypes.bfloat16)


def test_library_errors_raise_mxfp8error():
    with pytest.raises(mxfp8.MXFP8Error) as e:
        mxfp8.quantize(np.ones((2, 100), np.float32), group="wrapx")  # length not a multiple of 128
    assert e.value.status == _lib.ERR_UNSUPPORTED and e.value.message and "mxfp8_quantize" in e.value.message
    with pytest.raises(TypeError, match="x: dtype complex64 is not accepted") as e:  # as matmul: TypeError in Python
        mxfp8.quantize(np.ones((2, 32), np.complex64))  # (float64 is rounded to float32: test_float64.py)
    assert "float32" in str(e.value) and "bfloat16" in str(e.value)
    d, s = mxfp8.quantize(np.ones((4, 64), np.float32))
    with pytest.raises(mxfp8.MXFP8Error) as e:
        mxfp8.dequantize(d, s[:, :1])  # scales of the wrong shape
    assert e.value.status == _lib.ERR_SHAPE_MISMATCH and e.value.message
    with pytest.raises(mxfp8.MXFP8Error) as e:
        mxfp8.swizzle_nki(np.zeros((96, 4), np.uint8))  # K not a multiple of 128
    assert e.value.status in (_lib.ERR_UNSUPPORTED, _lib.ERR_SHAPE_MISMATCH)
    with pytest.raises(mxfp8.MXFP8Error) as e:
        mxfp8.set_num_threads(-1)
    assert e.value.status == _lib.ERR_INVALID_ARGUMENT and "-1" in e.value.message
    with pytest.raises(TypeError, match="^x: dtype int16"):
        mxfp8.quantize(np.ones((2, 32), np.int16))  # no mxfp8 dtype at all
    with pytest.raises(TypeError, match="^scales: dtype int16"):
        mxfp8.dequantize(d, s.astype(np.int16))
    err = pickle.loads(pickle.dumps(mxfp8.MXFP8Error(3, "m")))
    assert err.status == 3 and err.message == "m" and "MXFP8_ERR_SHAPE_MISMATCH" in str(err)


def test_failed_call_leaves_no_stale_message():
    """The message of an error belongs to that call: a later success does not raise, a later failure says its own."""
    with pytest.raises(mxfp8.MXFP8Error):
        mxfp8.set_num_threads(-5)
    mxfp8.quantize(np.ones(32, np.float32))
    with pytest.raises(mxfp8.MXFP8Error) as e:
        mxfp8.quantize(np.ones(100, np.float32), group="wrapx")
    assert "-5" not in e.value.message


# ---------------------------------------------------------------------------------------------------------------
# runtime
# ---------------------------------------------------------------------------------------------------------------
def test_info_and_version():
    inf = mxfp8.info()
    assert inf["version"] == mxfp8.__version__
    assert inf["isa"] in ("scalar", "avx512", "amx") and inf["num_threads"] >= 1
    if os.environ.get("MXFP8_ISA") == "scalar":
        assert inf["isa"] == "scalar"
    env = os.environ.get("MXFP8_LIBRARY")
    if env:
        assert inf["library"] == env
    else:
        pkg = os.path.dirname(os.path.abspath(mxfp8.__file__))
        repo_build = os.path.join(os.path.dirname(os.path.dirname(pkg)), "build")
        assert os.path.dirname(inf["library"]) in (pkg, repo_build)
        if os.path.dirname(inf["library"]) == pkg:  # installed by pip: the distribution's version agrees
            import importlib.metadata
            assert importlib.metadata.version("mxfp8") == mxfp8.__version__


def test_results_independent_of_thread_count(rng):
    x = spread(rng, (257, 1024), ml_dtypes.bfloat16)
    try:
        outs = []
        for n in (1, 2, 3):
            mxfp8.set_num_threads(n)
            assert mxfp8.info()["num_threads"] == n
            d0, s0 = mxfp8.quantize(x, axis=0, scale_rule="rceil")
            d1, s1 = mxfp8.quantize(x, axis=-1, group="wrapx")
            outs.append((bits(d0).copy(), s0, bits(d1).copy(), s1, bits(mxfp8.dequantize(d1, s1, group="wrapx"))))
        for o in outs[1:]:
            assert all(np.array_equal(a, b) for a, b in zip(outs[0], o))
    finally:
        mxfp8.set_num_threads(0)
