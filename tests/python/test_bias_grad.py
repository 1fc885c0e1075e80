"""mxfp8.bias_grad / mxfp8_bias_grad: the bias gradient sum_m dY[m, n] in FP32 in the documented fixed order.

Checked against matmul_oracle.bias_grad (the order written from the header's text, recursively), against the
exact sum (math.fsum) within the documented error bound, for 1, 2 and 3 threads (the same bits), for strided
views, and through mxfp8.torch's linear backward."""

import math

import ml_dtypes
import numpy as np
import pytest

import matmul_oracle
import mxfp8

U = 2.0 ** -24


@pytest.fixture
def threads():
    old = mxfp8.info()["num_threads"]
    yield mxfp8.set_num_threads
    mxfp8.set_num_threads(old)


def bits(a):
    return np.ascontiguousarray(a).view(np.uint8).tobytes()


@pytest.mark.parametrize("M", [0, 1, 31, 32, 33, 64, 95, 96, 97, 200, 255, 350, 1000, 2048])
@pytest.mark.parametrize("N", [1, 17, 128, 300])
def test_bits_match_the_documented_order(rng, M, N):
    dy = rng.standard_normal((M, N)).astype(np.float32) * np.exp2(rng.integers(-20, 20, (M, N))).astype(np.float32)
    got = mxfp8.bias_grad(dy)
    assert got.dtype == np.float32 and got.shape == (N,)
    assert bits(got) == bits(matmul_oracle.bias_grad(dy))


def test_error_bound_against_the_exact_sum(rng):
    """|got - exact| <= (31 + ceil(log2 chunks)) u sum|dY| (+ the bound's own slack), per column."""
    M, N = 4096, 64
    dy = (rng.standard_normal((M, N)) * 3 + 1).astype(np.float32)
    got = mxfp8.bias_grad(dy).astype(np.float64)
    exact = np.array([math.fsum(dy[:, n].astype(np.float64)) for n in range(N)])
    s = np.abs(dy.astype(np.float64)).sum(0)
    levels = 31 + math.ceil(math.log2(M / 32))
    gamma = levels * U / (1 - levels * U)
    assert np.all(np.abs(got - exact) <= gamma * s)
    # and far better than the bound in practice: the FP64 sum of a sequential FP32 loop would be about 10x worse
    assert np.abs(got - exact).max() <= 1e-5 * s.max()


@pytest.mark.parametrize("src", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("out", ["float32", "bfloat16", "float16"])
def test_dtypes_round_once(rng, src, out):
    npd = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
    dy = rng.standard_normal((77, 45)).astype(npd[src])
    got = mxfp8.bias_grad(dy, output_dtype=out)
    assert got.dtype == np.dtype(npd[out])
    assert bits(got) == bits(matmul_oracle.bias_grad(dy.astype(np.float32), npd[out]))


def test_same_bits_for_1_2_3_threads_and_strides(rng, threads):
    big = rng.standard_normal((3000, 700)).astype(np.float32)
    dy = big[::2, 5:605]  # [1500, 600], row stride 1400
    ref = matmul_oracle.bias_grad(dy)
    for nt in (1, 2, 3):
        threads(nt)
        assert bits(mxfp8.bias_grad(dy)) == bits(ref), nt
        assert bits(mxfp8.bias_grad(np.ascontiguousarray(dy.T).T)) == bits(ref), nt  # column-major


def test_ieee_specials_and_subnormals(rng):
    dy = rng.standard_normal((70, 8)).astype(np.float32)
    dy[3, 0] = np.inf
    dy[5, 1] = np.nan
    dy[:, 2] = np.float32(2.0 ** -140)  # subnormals: kept (no DAZ), their sum exact
    dy[0, 3], dy[1, 3] = np.float32(3e38), np.float32(3e38)  # overflows to inf in FP32
    got = mxfp8.bias_grad(dy)
    assert bits(got) == bits(matmul_oracle.bias_grad(dy))
    assert got[0] == np.inf and np.isnan(got[1]) and got[2] == np.float32(70 * 2.0 ** -140) and got[3] == np.inf


def test_bad_input():
    with pytest.raises(ValueError, match="2-D"):
        mxfp8.bias_grad(np.zeros(5, np.float32))
    with pytest.raises(TypeError):
        mxfp8.bias_grad(np.zeros((2, 3), np.int32))
    with pytest.raises(ValueError):
        mxfp8.bias_grad(np.zeros((2, 3), np.float32), output_dtype="float8_e4m3fn")


def test_torch_linear_bias_grad_is_the_library_sum(rng):
    import torch
    import mxfp8.torch as mt
    for dt in (torch.float32, torch.bfloat16):
        x = torch.randn(3, 50, 64, dtype=dt, requires_grad=True)
        w = torch.randn(40, 64, dtype=dt, requires_grad=True)
        b = torch.randn(40, dtype=dt, requires_grad=True)
        dy = torch.randn(3, 50, 40, dtype=dt)
        mt.linear(x, w, b, recipe="mxfp8").backward(dy)
        ref = matmul_oracle.bias_grad(dy.float().reshape(-1, 40).numpy())
        assert torch.equal(b.grad, torch.from_numpy(ref).to(dt))
