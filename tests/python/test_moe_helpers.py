"""The router and expert-layout helpers (topk_weights_grad, from_mixtral, to_mixtral) against hand-written numpy
loops and against the layer's definition, plus the MoE API's guard rails: the block_size hint and `checkpoints`
given as one string.
"""

import ml_dtypes
import numpy as np
import pytest

import mxfp8


def _ids(rng, T, E, K):
    return np.array([rng.permutation(E)[:K] for _ in range(T)], np.int32).reshape(T, K)


# ---- topk_weights_grad ----
def test_topk_weights_grad_is_the_gather(rng):
    T, E, K = 9, 5, 3
    ids = _ids(rng, T, E, K)
    da = rng.standard_normal((T * E, 1)).astype(np.float32)
    got = mxfp8.topk_weights_grad(da, ids)
    want = np.empty((T, K), np.float32)
    for t in range(T):
        for k in range(K):
            want[t, k] = da[t * E + ids[t, k], 0]
    assert got.shape == (T, K) and got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(mxfp8.topk_weights_grad(da.reshape(-1), ids.astype(np.int64)), want)
    bf = da.astype(ml_dtypes.bfloat16)
    g = mxfp8.topk_weights_grad(bf, ids)
    assert g.dtype == bf.dtype and np.array_equal(g.astype(np.float32), want.astype(ml_dtypes.bfloat16).astype(
        np.float32))
    assert mxfp8.topk_weights_grad(np.zeros((0, 1), np.float32), np.zeros((0, 2), np.int32), 4).shape == (0, 2)


def test_topk_weights_grad_errors():
    ids = np.array([[0, 1], [2, 0]])
    with pytest.raises(ValueError, match="T\\*E"):
        mxfp8.topk_weights_grad(np.zeros((7, 1), np.float32), ids)
    with pytest.raises(ValueError, match="in \\[0, 3\\)"):
        mxfp8.topk_weights_grad(np.zeros((6, 1), np.float32), [[0, 3], [1, 2]])
    with pytest.raises(ValueError, match="twice"):
        mxfp8.topk_weights_grad(np.zeros((6, 1), np.float32), [[1, 1], [0, 2]])
    with pytest.raises(TypeError, match="integer"):
        mxfp8.topk_weights_grad(np.zeros((6, 1), np.float32), np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match="num_experts"):
        mxfp8.topk_weights_grad(np.zeros((0, 1), np.float32), np.zeros((0, 2), np.int32))
    with pytest.raises(ValueError, match="expected T\\*E = 2\\*4"):
        mxfp8.topk_weights_grad(np.zeros((6, 1), np.float32), ids, num_experts=4)


def test_topk_weights_grad_is_the_derivative_of_the_layer(rng):
    """route copies the top-k weights into the affinities and the layer is linear in them, so a step h in
    topk_weights[t, k] changes <output, dY> by exactly h * topk_weights_grad(da)[t, k] (FP64 golden, unquantized)."""
    T, H, I, E, K, B = 6, 16, 8, 4, 2, 4
    ids = _ids(rng, T, E, K)
    w = rng.uniform(0.25, 1, (T, K)).astype(np.float32)
    X = rng.uniform(-1, 1, (T, H)).astype(np.float32)
    W1 = rng.uniform(-0.5, 0.5, (E, H, 2, I)).astype(np.float32)
    W2 = rng.uniform(-0.5, 0.5, (E, I, H)).astype(np.float32)
    dY = rng.uniform(-1, 1, (T, H)).astype(np.float32)

    def loss(weights):
        tp, be, a = mxfp8.route(ids, weights, E, B)
        y, _ = mxfp8.blockwise_mm_fwd_golden(X, a, W1, W2, tp, be, B)
        return float(np.sum(y * dY.astype(np.float64)))

    tp, be, a = mxfp8.route(ids, w, E, B)
    da = mxfp8.blockwise_mm_bwd_golden(X, a, W1, W2, tp, be, dY, B)[1]
    g = mxfp8.topk_weights_grad(da, ids)
    h = 2.0 ** -6  # w + h is exact in float32
    for t, k in [(0, 0), (3, 1), (5, 0)]:
        wp = w.copy()
        wp[t, k] += h
        fd = (loss(wp) - loss(w)) / h
        assert fd == pytest.approx(g[t, k], rel=1e-9, abs=1e-12), (t, k)


# ---- from_mixtral / to_mixtral ----
def _mixtral(rng, E=3, H=40, I=24, dtype=np.float32):
    w1 = rng.standard_normal((E, I, H)).astype(dtype)  # experts.{e}.w1.weight: [I, H] (gate)
    w3 = rng.standard_normal((E, I, H)).astype(dtype)  # experts.{e}.w3.weight: [I, H] (up)
    w2 = rng.standard_normal((E, H, I)).astype(dtype)  # experts.{e}.w2.weight: [H, I] (down)
    return w1, w3, w2


def test_from_mixtral_layout(rng):
    w1, w3, w2 = _mixtral(rng)
    E, I, H = w1.shape
    gu, dn = mxfp8.from_mixtral(w1, w3, w2)
    assert gu.shape == (E, H, 2, I) and dn.shape == (E, I, H)
    assert gu.flags.c_contiguous and dn.flags.c_contiguous
    for e in range(E):
        for h in range(H):
            for i in range(I):
                assert gu[e, h, 0, i] == w1[e, i, h] and gu[e, h, 1, i] == w3[e, i, h]
                assert dn[e, i, h] == w2[e, h, i]
    # lists of per-expert weights, as a state dict holds them
    gu2, dn2 = mxfp8.from_mixtral(list(w1), list(w3), [w2[e] for e in range(E)])
    np.testing.assert_array_equal(gu2, gu)
    np.testing.assert_array_equal(dn2, dn)


def test_to_mixtral_inverts_and_keeps_dtype(rng):
    w1, w3, w2 = _mixtral(rng, dtype=ml_dtypes.bfloat16)
    gu, dn = mxfp8.from_mixtral(w1, w3, w2)
    assert gu.dtype == dn.dtype == np.dtype(ml_dtypes.bfloat16)
    for a, b in zip(mxfp8.to_mixtral(gu, dn), (w1, w3, w2)):
        assert a.dtype == b.dtype and a.flags.c_contiguous
        np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16))


def test_from_mixtral_matches_the_hugging_face_expert(rng):
    """The Mixtral expert y = w2 @ (silu(w1 @ x) * (w3 @ x)) (nn.Linear weights), written out in numpy, equals the
    library's FP64 golden forward with the converted weights (every token routed to one expert, affinity 1)."""
    E, H, I, T = 2, 32, 16, 5
    w1, w3, w2 = (w * 0.2 for w in _mixtral(rng, E, H, I))
    x = rng.uniform(-1, 1, (T, H)).astype(np.float32)
    gu, dn = mxfp8.from_mixtral(w1, w3, w2)
    for e in range(E):
        ids = np.full((T, 1), e, np.int32)
        tp, be, a = mxfp8.route(ids, np.ones((T, 1), np.float32), E, 4)
        y, _ = mxfp8.blockwise_mm_fwd_golden(x, a, gu, dn, tp, be, 4)
        x64, g64, u64 = x.astype(np.float64), w1[e].astype(np.float64), w3[e].astype(np.float64)
        gate = x64 @ g64.T
        want = (gate / (1 + np.exp(-gate)) * (x64 @ u64.T)) @ w2[e].astype(np.float64).T
        np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)


def test_mixtral_layout_errors(rng):
    w1, w3, w2 = _mixtral(rng)
    with pytest.raises(ValueError, match="w2: expected \\[E, H, I\\]"):
        mxfp8.from_mixtral(w1, w3, w2.transpose(0, 2, 1))
    with pytest.raises(ValueError, match="one shape"):
        mxfp8.from_mixtral(w1, w3[:, :-1], w2)
    with pytest.raises(TypeError, match="one dtype"):
        mxfp8.from_mixtral(w1, w3.astype(np.float16), w2)
    with pytest.raises(ValueError, match="\\[E, H, 2, I\\]"):
        mxfp8.to_mixtral(w1, w2)
    with pytest.raises(ValueError, match="down_proj_weight"):
        mxfp8.to_mixtral(*mxfp8.from_mixtral(w1, w3, w2)[:1], w2)


# ---- guard rails of the MoE API ----
def _small(rng, T=16, H=32, I=32, E=4, K=2, B=8):
    ids = _ids(rng, T, E, K)
    tp, be, a = mxfp8.route(ids, rng.uniform(0, 1, (T, K)).astype(np.float32), E, B)
    return dict(X=rng.standard_normal((T, H)).astype(np.float32), a=a, tp=tp, be=be,
                W1=(rng.standard_normal((E, H, 2, I)) * 0.1).astype(np.float32),
                W2=(rng.standard_normal((E, I, H)) * 0.1).astype(np.float32),
                dY=rng.standard_normal((T, H)).astype(np.float32), B=B)


def test_block_size_error_says_what_to_pass(rng):
    p = _small(rng)
    for call in (lambda **kw: mxfp8.blockwise_mm_fwd_mxfp8(p["X"], p["a"], p["W1"], p["W2"], p["tp"], p["be"], **kw),
                 lambda **kw: mxfp8.blockwise_mm_bwd_mxfp8(p["X"], p["a"], p["W1"], p["W2"], p["tp"], p["be"],
                                                           p["dY"], **kw)):
        with pytest.raises(mxfp8.MXFP8Error) as e:
            call()  # the NKI default block_size=4096
        msg = e.value.message
        assert e.value.status == 3 and "not a multiple of block_size 4096" in msg  # the library's own message
        assert "NKI default" in msg and "block_size=8" in msg and "pass block_size=" in msg, msg
        with pytest.raises(mxfp8.MXFP8Error) as e:
            call(block_size=4)  # 56 positions are a multiple of 4, but the table was built with 8
        assert "block_size=8" in e.value.message and "NKI default" not in e.value.message, e.value.message
        call(block_size=p["B"])  # the right value works
    # an error unrelated to block_size carries no hint
    with pytest.raises(mxfp8.MXFP8Error) as e:
        mxfp8.blockwise_mm_fwd_mxfp8(p["X"][:, :-1], p["a"], p["W1"], p["W2"], p["tp"], p["be"], p["B"])
    assert "block_size" not in e.value.message, e.value.message


def test_checkpoints_as_one_string(rng):
    p = _small(rng)
    args = (p["X"], p["a"], p["W1"], p["W2"], p["tp"], p["be"], p["B"])
    _, one = mxfp8.blockwise_mm_fwd_mxfp8(*args, checkpoints="gate_act_checkpoint_T")
    _, lst = mxfp8.blockwise_mm_fwd_mxfp8(*args, checkpoints=["gate_act_checkpoint_T"])
    _, every = mxfp8.blockwise_mm_fwd_mxfp8(*args, checkpoints="all")
    assert list(one) == list(lst) == ["gate_act_checkpoint_T"]
    assert sorted(every) == sorted(mxfp8.MOE_CHECKPOINTS)
    np.testing.assert_array_equal(one["gate_act_checkpoint_T"], every["gate_act_checkpoint_T"])
    _, none = mxfp8.blockwise_mm_fwd_mxfp8(*args, checkpoints=None)
    assert none == {}
    with pytest.raises(ValueError, match="unknown checkpoint 'gate_act'"):
        mxfp8.blockwise_mm_fwd_mxfp8(*args, checkpoints="gate_act")
    with pytest.raises(TypeError, match="checkpoint names"):
        mxfp8.blockwise_mm_fwd_mxfp8(*args, checkpoints=[1])
