"""float64 (numpy's default dtype), Python numbers and lists are accepted wherever float32 is, and are rounded once
to float32: every entry point gives bitwise the result of the same values as float32 arrays. The float64 inputs
are float32 values widened exactly, except where a test checks the rounding itself (values between two float32s).
"""

import ml_dtypes
import numpy as np
import pytest

import mxfp8


def bits(a):
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(bits(a), bits(b))


def f32(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def test_quantize_float64_equals_float32(rng):
    x = f32(rng, (6, 100), 30.0)
    x[2, :40] = 0.0
    x[3, 5] = np.inf
    for fmt in ("e4m3", "e5m2"):
        for rule in ("nki", "ocp", "rceil"):
            for axis in (0, 1, -1):
                d32, s32 = mxfp8.quantize(x, fmt=fmt, axis=axis, scale_rule=rule)
                d64, s64 = mxfp8.quantize(x.astype(np.float64), fmt=fmt, axis=axis, scale_rule=rule)
                same(d32, d64)
                same(s32, s64)
    # strided float64 views, wrapx groups
    x = f32(rng, (256, 8))
    same(mxfp8.quantize(x[::2].T, group="wrapx")[0], mxfp8.quantize(x.astype(np.float64)[::2].T, group="wrapx")[0])


def test_quantize_rounds_float64_to_float32_first(rng):
    """A float64 value between two float32s is rounded to nearest (even) float32 before quantizing: the
    result is that of x.astype(np.float32), also where quantizing the float64 value directly would differ."""
    base = np.float32(1.0625)  # with amax 1.0625 (scale 2^-7 under "nki"), E4M3 steps near 1.0625 are 2^-3 * 2^0
    ulp = np.spacing(base)
    x = np.full(32, 0.5, np.float64)
    x[0] = float(base) + 0.75 * float(ulp)  # rounds up to base + ulp in float32
    x[1] = float(base) + 0.25 * float(ulp)  # rounds down to base
    x[2] = 1.0 + 2.0 ** -4  # exactly between two E4M3 codes, exactly representable in float32
    d64, s64 = mxfp8.quantize(x)
    d32, s32 = mxfp8.quantize(x.astype(np.float32))
    same(d64, d32)
    same(s64, s32)
    assert np.float32(x[0]) == base + ulp and np.float32(x[1]) == base


def test_python_numbers_and_lists(rng):
    x = f32(rng, (3, 40))
    same(mxfp8.quantize(x.tolist())[0], mxfp8.quantize(x)[0])           # lists of Python floats
    same(mxfp8.quantize([1, 2, 3])[0], mxfp8.quantize(np.array([1, 2, 3], np.float32))[0])  # Python ints
    same(mxfp8.quantize(np.float64(3.5).reshape(1))[0], mxfp8.quantize(np.array([3.5], np.float32))[0])


def test_other_dtypes_still_rejected():
    for dt in (np.complex64, np.int16, np.float16):
        x = np.ones((2, 32), dt)
        if dt == np.float16:
            mxfp8.quantize(x)  # accepted as such (not converted)
            continue
        with pytest.raises(TypeError, match=r"^x: dtype .* is not accepted .*float64 \(rounded to float32\)"):
            mxfp8.quantize(x)


def test_dequantize_to_float64(rng):
    x = f32(rng, (4, 96), 1e3)
    d, s = mxfp8.quantize(x, fmt="e5m2")
    y32 = mxfp8.dequantize(d, s)
    y64 = mxfp8.dequantize(d, s, out_dtype="float64")
    assert y64.dtype == np.float64
    np.testing.assert_array_equal(y64, y32.astype(np.float64))
    np.testing.assert_array_equal(mxfp8.dequantize(d, s, out_dtype=np.float64), y64)
    # exact: the codes' values times 2^(s - 127), from ml_dtypes
    want = d.astype(np.float64) * np.exp2(np.repeat(s.astype(np.float64) - 127, 32, axis=1)[:, :96])
    np.testing.assert_array_equal(y64, want)


@pytest.mark.parametrize("f8", ["float8_e5m2", "float8_e4m3fn"])
def test_matmul_backward_float64_equals_float32(rng, f8):
    M, N, K = 40, 72, 56
    dy, w, x = f32(rng, (M, N)), f32(rng, (N, K)), f32(rng, (M, K))
    for out in ("bfloat16", "float32"):
        ref = mxfp8.matmul_mxfp8_backward(dy, w, x, float8_dtype=f8, output_dtype=out)
        got = mxfp8.matmul_mxfp8_backward(dy.astype(np.float64), w.astype(np.float64), x.astype(np.float64),
                                          float8_dtype=f8, output_dtype=out)
        for r, g in zip(ref, got):
            same(r, g)
    # mixed: one float64 operand, the others bfloat16 / float32 / a list
    ref = mxfp8.matmul_mxfp8_backward(dy.astype(ml_dtypes.bfloat16), w, x, float8_dtype=f8)
    got = mxfp8.matmul_mxfp8_backward(dy.astype(ml_dtypes.bfloat16), w.astype(np.float64), x.tolist(),
                                      float8_dtype=f8)
    for r, g in zip(ref, got):
        same(r, g)


def test_matmul_forward_float64_equals_float32(rng):
    x, w = f32(rng, (24, 96)), f32(rng, (40, 96))
    same(mxfp8.matmul_mxfp8(x, w), mxfp8.matmul_mxfp8(x.astype(np.float64), w.astype(np.float64)))
    same(mxfp8.matmul_mxfp8(x, w, output_dtype="float32"),
         mxfp8.matmul_mxfp8(x.tolist(), w.astype(np.float64), output_dtype="float32"))


def test_matmul_goldens_take_float64_of_float32_values(rng):
    a, b = f32(rng, (8, 64)), f32(rng, (12, 64))
    same(mxfp8.matmul_golden_quantized(a, b), mxfp8.matmul_golden_quantized(a.astype(np.float64), b))
    same(mxfp8.matmul_golden_unquantized(a, b), mxfp8.matmul_golden_unquantized(a.astype(np.float64), b))


def _moe(rng, T=24, H=40, I=24, E=3, K=2, B=8):
    ids = np.array([rng.permutation(E)[:K] for _ in range(T)], np.int32)
    return dict(X=rng.uniform(0, 1, (T, H)).astype(np.float32), dY=f32(rng, (T, H)),
                W1=(rng.uniform(-0.1, 0.1, (E, H, 2, I))).astype(np.float32),
                W2=(rng.uniform(-0.1, 0.1, (E, I, H))).astype(np.float32),
                b1=f32(rng, (E, 2, I), 0.1), b2=f32(rng, (E, H), 0.1),
                ids=ids, w=rng.uniform(0, 1, (T, K)).astype(np.float32), E=E, B=B)


def test_route_float64_weights(rng):
    p = _moe(rng)
    ref = mxfp8.route(p["ids"], p["w"], p["E"], p["B"])
    got = mxfp8.route(p["ids"].astype(np.int64), p["w"].astype(np.float64), p["E"], p["B"])
    for r, g in zip(ref, got):
        same(r, g)
    got = mxfp8.route(p["ids"].tolist(), p["w"].tolist(), p["E"], p["B"])
    for r, g in zip(ref, got):
        same(r, g)


def _f64(p, *names):
    return {k: (v.astype(np.float64) if k in names else v) for k, v in p.items()}


@pytest.mark.parametrize("bias", [False, True])
def test_moe_forward_and_backward_float64_equal_float32(rng, bias):
    p = _moe(rng)
    tp, be, a = mxfp8.route(p["ids"], p["w"], p["E"], p["B"])
    cfg = mxfp8.MXFP8MOEBwdConfig(bias=bias,
                                  clamp_limits=mxfp8.ClampLimits(non_linear_clamp_upper_limit=0.5))
    q = _f64(p, "X", "dY", "W1", "W2", "b1", "b2")
    kb = (lambda d: dict(gate_and_up_proj_bias=d["b1"], down_proj_bias=d["b2"])) if bias else (lambda d: {})

    def fwd(d, aff):
        return mxfp8.blockwise_mm_fwd_mxfp8(d["X"], aff, d["W1"], d["W2"], tp, be, p["B"], config=cfg,
                                            checkpoints="all", **kb(d))

    y32, ck32 = fwd(p, a)
    y64, ck64 = fwd(q, a.astype(np.float64))
    same(y32, y64)  # float64 hidden_states give float32 outputs, as float32 ones
    assert sorted(ck32) == sorted(ck64)
    for k in ck32:
        same(ck32[k], ck64[k])
    g32 = mxfp8.blockwise_mm_bwd_mxfp8(p["X"], a, p["W1"], p["W2"], tp, be, p["dY"], p["B"], config=cfg,
                                       gate_up_proj_act_checkpoint_T=ck32["gate_up_proj_act_checkpoint_T"], **kb(p))
    g64 = mxfp8.blockwise_mm_bwd_mxfp8(q["X"], a.astype(np.float64), q["W1"], q["W2"], tp.astype(np.int64),
                                       be.astype(np.int64), q["dY"], p["B"], config=cfg,
                                       gate_up_proj_act_checkpoint_T=ck64["gate_up_proj_act_checkpoint_T"].astype(
                                           np.float64), **kb(q))
    assert len(g32) == len(g64) == (6 if bias else 4)
    for r, g in zip(g32, g64):
        same(r, g)
    # explicit grad_dtype keeps working with float64 inputs
    gb = mxfp8.blockwise_mm_bwd_mxfp8(q["X"], a, q["W1"], q["W2"], tp, be, q["dY"], p["B"], config=cfg,
                                      grad_dtype="bfloat16", **kb(q))
    gr = mxfp8.blockwise_mm_bwd_mxfp8(p["X"], a, p["W1"], p["W2"], tp, be, p["dY"], p["B"], config=cfg,
                                      grad_dtype="bfloat16", **kb(p))
    for r, g in zip(gr, gb):
        same(r, g)


def test_moe_goldens_float64_of_float32_values(rng):
    p = _moe(rng, T=10, H=32, I=16, E=2, K=1, B=4)
    tp, be, a = mxfp8.route(p["ids"], p["w"], p["E"], p["B"])
    q = _f64(p, "X", "dY", "W1", "W2")
    for quantized in (False, True):
        r = mxfp8.blockwise_mm_bwd_golden(p["X"], a, p["W1"], p["W2"], tp, be, p["dY"], p["B"], quantized=quantized)
        g = mxfp8.blockwise_mm_bwd_golden(q["X"], a, q["W1"], q["W2"], tp, be, q["dY"], p["B"], quantized=quantized)
        for x, y in zip(r, g):
            same(x, y)
