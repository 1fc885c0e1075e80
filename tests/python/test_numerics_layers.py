"""Statistics and stochastic rounding through the layers' Python functions: matmul_mxfp8, matmul_mxfp8_backward and
the MoE passes. Each operand's statistics equal mxfp8.quantize's statistics of the same quantization (whose
statistics and stochastic codes test_numerics.py checks against independent oracles); outputs do not change when
statistics are collected; stochastic rounding is reproducible and differs from nearest rounding.
"""

import numpy as np
import pytest

import mxfp8


def test_matmul_backward_stats_and_rounding(rng):
    M, N, K = 64, 96, 48
    dy, w, x = (rng.standard_normal(s).astype(np.float32) for s in ((M, N), (N, K), (M, K)))
    kw = dict(float8_dtype="float8_e4m3fn", output_dtype="float32")
    ig, wg, st = mxfp8.matmul_mxfp8_backward(dy, w, x, stats=True, **kw)
    ig0, wg0 = mxfp8.matmul_mxfp8_backward(dy, w, x, **kw)
    assert np.array_equal(ig, ig0) and np.array_equal(wg, wg0), "statistics changed the outputs"
    assert list(st) == list(mxfp8.BWD_QUANTIZATIONS)
    want = {"output_grad_along_n": (dy, 1), "weights_along_n": (w, 0), "output_grad_along_m": (dy, 0),
            "input_activation_along_m": (x, 0)}
    for name, (t, axis) in want.items():
        assert st[name] == mxfp8.quantize(t, "e4m3", axis=axis, stats=True)[2], name
    sr = dict(output_grad_rounding="stochastic", weights_rounding="stochastic", input_rounding="stochastic")
    a = mxfp8.matmul_mxfp8_backward(dy, w, x, rounding_seed=7, stats=True, **sr, **kw)
    b = mxfp8.matmul_mxfp8_backward(dy, w, x, rounding_seed=7, stats=True, **sr, **kw)
    c = mxfp8.matmul_mxfp8_backward(dy, w, x, rounding_seed=8, **sr, **kw)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]
    assert not np.array_equal(a[0], c[0]) and not np.array_equal(a[0], ig0)
    for q, (name, (t, axis)) in enumerate(want.items()):
        assert a[2][name] == mxfp8.quantize(t, "e4m3", axis=axis, rounding="stochastic", seed=7, stream=q,
                                            stats=True)[2], name
    with pytest.raises(ValueError, match="rounding"):
        mxfp8.matmul_mxfp8_backward(dy, w, x, output_grad_rounding="up", **kw)


def test_matmul_forward_stats_and_rounding(rng):
    x, w = rng.standard_normal((40, 64)).astype(np.float32), rng.standard_normal((24, 64)).astype(np.float32)
    y, st = mxfp8.matmul_mxfp8(x, w, output_dtype="float32", stats=True, input_rounding="stochastic",
                               rounding_seed=3)
    assert st["input_activation"] == mxfp8.quantize(x, "e5m2", rounding="stochastic", seed=3, stream=0,
                                                    stats=True)[2]
    assert st["weights"] == mxfp8.quantize(w, "e5m2", stats=True)[2]
    d, s = mxfp8.quantize(x, "e5m2", rounding="stochastic", seed=3, stream=0)
    y2 = mxfp8.matmul_mxfp8(d, w, input_scales=s, output_dtype="float32")
    assert np.array_equal(y, y2), "the GEMM of x rounded stochastically differs from x pre-quantized alike"


def _dense(rng, T=64, H=64, I=32):
    return (rng.uniform(0, 1, (T, H)).astype(np.float32), rng.uniform(0, 1, (T, 1)).astype(np.float32),
            rng.uniform(-0.1, 0.1, (1, H, 2, I)).astype(np.float32),
            rng.uniform(-0.1, 0.1, (1, I, H)).astype(np.float32), rng.uniform(-1, 1, (T, H)).astype(np.float32))


def test_moe_stats_and_rounding(rng):
    X, a, W1, W2, dY = _dense(rng)
    B = 32
    cfg = mxfp8.MXFP8MOEBwdConfig(single_expert_dense=True, stochastic_rounding="gradients", rounding_seed=11)
    y, cks, fst = mxfp8.blockwise_mm_fwd_mxfp8(X, a, W1, W2, None, None, B, cfg, stats=True)
    assert len(fst) == 1 and list(fst[0]) == list(mxfp8.MOE_OPERANDS)
    assert fst[0]["gemm1_x"] == mxfp8.quantize(X, "e4m3", stats=True)[2]
    assert fst[0]["gemm1_w1"] == mxfp8.quantize(W1.reshape(64, 64), "e4m3", axis=0, stats=True)[2]
    assert fst[0]["p1_dy"]["elements"] == 0, "the forward quantizes no gradient"
    *grads, bst = mxfp8.blockwise_mm_bwd_mxfp8(X, a, W1, W2, None, None, dY, B, config=cfg, stats=True, **cks)
    grads0 = mxfp8.blockwise_mm_bwd_mxfp8(X, a, W1, W2, None, None, dY, B, config=cfg, **cks)
    for g, g0 in zip(grads, grads0):
        assert np.array_equal(g, g0), "statistics changed the gradients"
    # dY rounded stochastically along H (stream p1_dy = 4) and along the tokens (p4_dy = 11), index t*H + h
    assert bst[0]["p1_dy"] == mxfp8.quantize(dY, "e4m3", axis=1, rounding="stochastic", seed=11, stream=4,
                                             stats=True)[2]
    assert bst[0]["p4_dy"] == mxfp8.quantize(dY, "e4m3", axis=0, rounding="stochastic", seed=11, stream=11,
                                             stats=True)[2]
    assert bst[0]["p1_w2"] == mxfp8.quantize(W2[0], "e4m3", axis=1, stats=True)[2]  # nearest: not a gradient
    near = mxfp8.blockwise_mm_bwd_mxfp8(X, a, W1, W2, None, None, dY, B,
                                        config=mxfp8.MXFP8MOEBwdConfig(single_expert_dense=True), **cks)
    assert not np.array_equal(near[0], grads[0])
    for bad in ("p9_x", ["p1_dy", "nope"], 1 << 12):
        with pytest.raises(ValueError, match="stochastic_rounding"):
            mxfp8.blockwise_mm_bwd_mxfp8(X, a, W1, W2, None, None, dY, B, config=mxfp8.MXFP8MOEBwdConfig(
                single_expert_dense=True, stochastic_rounding=bad), **cks)
