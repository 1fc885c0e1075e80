"""The gpt-oss SwiGLU activation of the MoE layer against an FP64 reference written here from its definition (the
gpt-oss model code: g clamped above at `limit`, u clamped to [-limit, limit], out = g * sigmoid(alpha g) * (u + 1)),
with the layer's strict clamp masks (a value at or beyond a limit gets zero gradient):

  * the FP64 golden's forward (output and every checkpoint) and every gradient (dX, the affinities', dW1, dW2, db1,
    db2) equal the reference, on problems whose gate and up values lie exactly at the limits, beyond them and inside;
  * central finite differences of the golden forward's loss sum(output * dY) match the golden backward (on a problem
    with no value near a limit, where the loss is differentiable);
  * the MXFP8 kernels agree with the quantized golden, their checkpoints hold the clamped values exactly, and alpha
    and limit are honoured when set.
"""

import math

import numpy as np
import pytest

import mxfp8


def reference(X, a, W1, W2, b1, b2, dY, alpha, limit):
    """Dense single-expert layer (every token in the expert), FP64: (output, g, u, act, inter, grads dict). alpha
    and limit are float32 parameters of the config, taken here at their float32 values."""
    X, a, W1, W2, b1, b2, dY = (np.asarray(v, np.float64) for v in (X, a, W1, W2, b1, b2, dY))
    alpha, limit = float(np.float32(alpha)), float(np.float32(limit))
    a = a.reshape(-1)
    pre_g = X @ W1[0, :, 0, :] + b1[0, 0]
    pre_u = X @ W1[0, :, 1, :] + b1[0, 1]
    g = np.minimum(pre_g, limit)                 # x_glu.clamp(max=limit)
    u = np.clip(pre_u, -limit, limit)            # x_linear.clamp(-limit, limit)
    sig = 1.0 / (1.0 + np.exp(-alpha * g))
    act = g * sig                                 # out_glu = x_glu * sigmoid(alpha * x_glu)
    inter = act * (u + 1.0)                       # out_glu * (x_linear + 1)
    down = inter @ W2[0] + b2[0]
    out = a[:, None] * down
    # backward of loss = sum(out * dY)
    d_down = a[:, None] * dY
    da = np.sum(dY * down, axis=1)
    d_inter = d_down @ W2[0].T
    dact = sig * (1.0 + alpha * g * (1.0 - sig))
    d_g = np.where(pre_g < limit, d_inter * (u + 1.0) * dact, 0.0)            # strict: g >= limit is masked
    d_u = np.where((pre_u > -limit) & (pre_u < limit), d_inter * act, 0.0)
    dgu = np.concatenate([d_g, d_u], axis=1)
    H, I = X.shape[1], W2.shape[1]
    grads = dict(hidden_states_grad=dgu @ W1[0].reshape(H, 2 * I).T,
                 expert_affinities_masked_grad=da.reshape(-1, 1),
                 gate_up_proj_weight_grad=(X.T @ dgu).reshape(1, H, 2, I),
                 down_proj_weight_grad=(inter.T @ d_down)[None],
                 gate_and_up_proj_bias_grad=dgu.sum(0).reshape(1, 2, I),
                 down_proj_bias_grad=d_down.sum(0)[None])
    return out, g, u, act, inter, grads


GRAD_ORDER = ("hidden_states_grad", "expert_affinities_masked_grad", "gate_up_proj_weight_grad",
              "down_proj_weight_grad", "gate_and_up_proj_bias_grad", "down_proj_bias_grad")


def problem(rng, T=64, H=48, I=40, scale=1.0, at_limits=True, limit=7.0):
    X = rng.uniform(-1, 1, (T, H)).astype(np.float32)
    W1 = (rng.uniform(-1, 1, (1, H, 2, I)) * scale).astype(np.float32)
    W2 = rng.uniform(-0.2, 0.2, (1, I, H)).astype(np.float32)
    a = rng.uniform(0, 1, (T, 1)).astype(np.float32)
    b1 = rng.uniform(-1, 1, (1, 2, I)).astype(np.float32)
    b2 = rng.uniform(-0.5, 0.5, (1, H)).astype(np.float32)
    dY = rng.uniform(-1, 1, (T, H)).astype(np.float32)
    if at_limits:  # tokens 0-3 have X = 0: g = b1 gate, u = b1 up exactly: at the limits and beyond
        X[:4] = 0
        b1[0, 0, :8] = np.array([limit, limit, 2 * limit, -limit, limit + 0.5, 0.25, -2 * limit, limit], np.float32)
        b1[0, 1, :8] = np.array([limit, -limit, 2 * limit, -2 * limit, 0.5, limit, -limit, limit + 1], np.float32)
    return X, a, W1, W2, b1, b2, dY


def config(alpha=1.702, limit=7.0):
    return mxfp8.MXFP8MOEBwdConfig(activation_type="gpt_oss_swiglu", bias=True, single_expert_dense=True,
                                   swiglu_alpha=alpha, swiglu_limit=limit)


def run_golden(P, B, cfg, quantized=False):
    X, a, W1, W2, b1, b2, dY = P
    kw = dict(gate_and_up_proj_bias=b1, down_proj_bias=b2)
    y, cks = mxfp8.blockwise_mm_fwd_golden(X, a, W1, W2, None, None, B, cfg, checkpoints="all", quantized=quantized,
                                           **kw)
    grads = mxfp8.blockwise_mm_bwd_golden(X, a, W1, W2, None, None, dY, B, cfg, quantized=quantized, **kw)
    return y, cks, grads


def unblock(ck, T):
    """[N, I, B] checkpoint -> [T, I] (dense routing: position p of block n is token n*B + p)."""
    N, I, B = ck.shape
    return ck.transpose(0, 2, 1).reshape(N * B, I)[:T]


@pytest.mark.parametrize("alpha,limit", [(1.702, 7.0), (1.0, 3.0), (2.5, math.inf)])
def test_golden_matches_reference(rng, alpha, limit):
    lim = 7.0 if math.isinf(limit) else limit
    P = problem(rng, scale=3.0, limit=lim)
    X, a, W1, W2, b1, b2, dY = P
    T, B = X.shape[0], 32
    y, cks, grads = run_golden(P, B, config(alpha, limit))
    out, g, u, act, inter, want = reference(X, a, W1, W2, b1, b2, dY, alpha, limit)
    np.testing.assert_allclose(y, out, rtol=1e-12, atol=1e-12)
    gu = cks["gate_up_proj_act_checkpoint_T"]
    np.testing.assert_array_equal(unblock(gu[:, 0], T), g)
    np.testing.assert_array_equal(unblock(gu[:, 1], T), u)
    np.testing.assert_allclose(unblock(cks["gate_act_checkpoint_T"], T), act, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(unblock(cks["intermediate_checkpoint_T"], T), inter, rtol=1e-13, atol=1e-15)
    for name, got in zip(GRAD_ORDER, grads):
        np.testing.assert_allclose(got, want[name], rtol=1e-11, atol=1e-11, err_msg=name)
    if not math.isinf(limit):
        # the clamped tokens: at or beyond the limits everywhere, so their dGU and hence dX are exactly zero in
        # the columns that are clamped on both halves, and g, u hold the limits
        assert np.max(unblock(gu[:, 0], T)) == limit and np.min(unblock(gu[:, 1], T)) == -limit
        assert np.any(np.abs(X @ W1[0, :, 0, :] + b1[0, 0]) > limit), "no value beyond the limit was exercised"


def test_finite_differences_on_the_golden(rng):
    """d loss / d parameter by central differences of the golden forward (FP64 arithmetic, unquantized) against the
    golden backward, for entries of every input. The inputs are float32 (the layer's input type): each entry moves
    by +-2^-10 (as rounded in float32, the step taken is the actual difference); the problem keeps every gate / up
    value at least 0.01 from a limit, farther than any step moves it, so the loss is differentiable there."""
    limit, alpha, h = 2.0, 1.702, 2.0 ** -10
    for _ in range(50):
        P = problem(rng, T=8, H=8, I=6, scale=1.5, at_limits=False, limit=limit)
        X, a, W1, W2, b1, b2, dY = P
        pre = np.concatenate([X.astype(np.float64) @ W1[0, :, 0, :] + b1[0, 0],
                              X.astype(np.float64) @ W1[0, :, 1, :] + b1[0, 1]], axis=1)
        if np.min(np.abs(np.abs(pre) - limit)) > 0.01 and np.sum(np.abs(pre) > limit) > 4:
            break
    else:
        pytest.fail("could not draw a problem away from the limits")
    cfg, B = config(alpha, limit), 4
    grads = dict(zip(GRAD_ORDER, mxfp8.blockwise_mm_bwd_golden(X, a, W1, W2, None, None, dY, B, cfg,
                                                               gate_and_up_proj_bias=b1, down_proj_bias=b2)))

    def loss(**over):
        args = dict(X=X, a=a, W1=W1, W2=W2, b1=b1, b2=b2)
        args.update(over)
        y, _ = mxfp8.blockwise_mm_fwd_golden(args["X"], args["a"], args["W1"], args["W2"], None, None, B, cfg,
                                             gate_and_up_proj_bias=args["b1"], down_proj_bias=args["b2"],
                                             checkpoints=())
        return float(np.sum(y * dY.astype(np.float64)))

    checks = [("X", X, "hidden_states_grad"), ("a", a, "expert_affinities_masked_grad"),
              ("W1", W1, "gate_up_proj_weight_grad"), ("W2", W2, "down_proj_weight_grad"),
              ("b1", b1, "gate_and_up_proj_bias_grad"), ("b2", b2, "down_proj_bias_grad")]
    for name, arr, gname in checks:
        for flat in rng.choice(arr.size, 6, replace=False):
            idx = np.unravel_index(flat, arr.shape)
            up, dn = arr.copy(), arr.copy()
            up[idx] += np.float32(h)
            dn[idx] -= np.float32(h)
            step = float(up[idx]) - float(dn[idx])  # 2h up to the float32 rounding of the shifted values
            fd = (loss(**{name: up}) - loss(**{name: dn})) / step
            an = grads[gname][idx]
            assert fd == pytest.approx(an, rel=1e-4, abs=1e-6), f"d loss / d {name}{idx}: fd {fd}, golden {an}"


@pytest.mark.parametrize("alpha,limit", [(1.702, 7.0), (1.3, 4.0)])
def test_kernels_match_the_quantized_golden(rng, alpha, limit):
    P = problem(rng, T=96, H=64, I=32, scale=3.0, limit=limit)
    X, a, W1, W2, b1, b2, dY = P
    T, B, cfg = X.shape[0], 32, config(alpha, limit)
    kw = dict(gate_and_up_proj_bias=b1, down_proj_bias=b2)
    y, cks = mxfp8.blockwise_mm_fwd_mxfp8(X, a, W1, W2, None, None, B, cfg, checkpoints="all", **kw)
    gy, gcks, ggrads = run_golden(P, B, cfg, quantized=True)
    gu = cks["gate_up_proj_act_checkpoint_T"]
    g, u = unblock(gu[:, 0], T), unblock(gu[:, 1], T)
    assert np.max(g) <= limit and np.max(np.abs(u)) <= limit and np.max(g) == limit and np.min(u) == -limit
    np.testing.assert_array_equal(g[:4, :8], np.minimum(b1[0, 0, :8], limit)[None].repeat(4, 0))
    r = mxfp8.compare_nki(y, gy)
    assert r["cosine"] > 0.99999, r
    grads = mxfp8.blockwise_mm_bwd_mxfp8(X, a, W1, W2, None, None, dY, B, config=cfg, **kw, **cks)
    for name, k, gg in zip(GRAD_ORDER, grads, ggrads):
        r = mxfp8.compare_nki(k, gg)
        assert r["cosine"] > 0.9999 and r["num_nan"] == 0, (name, r)
    # with the defaults of the other activations' parameters the result differs from plain Swish (the +1 on u)
    sw = mxfp8.blockwise_mm_fwd_mxfp8(X, a, W1, W2, None, None, B, mxfp8.MXFP8MOEBwdConfig(
        activation_type="swish", bias=True, single_expert_dense=True), **kw)[0]
    assert not np.allclose(sw, y)


def test_bad_parameters():
    P = problem(np.random.default_rng(0), T=32, H=32, I=32)
    X, a, W1, W2, b1, b2, dY = P
    for alpha, limit in ((1.702, 0.0), (1.702, -1.0), (math.inf, 7.0), (1.702, math.nan)):
        with pytest.raises(mxfp8.MXFP8Error, match="swiglu"):
            mxfp8.blockwise_mm_fwd_mxfp8(X, a, W1, W2, None, None, 32, config(alpha, limit),
                                         gate_and_up_proj_bias=b1, down_proj_bias=b2)
    with pytest.raises(mxfp8.MXFP8Error, match="clamp limits"):
        cfg = config()
        cfg.clamp_limits = mxfp8.ClampLimits(non_linear_clamp_lower_limit=8.0)
        mxfp8.blockwise_mm_fwd_mxfp8(X, a, W1, W2, None, None, 32, cfg, gate_and_up_proj_bias=b1,
                                     down_proj_bias=b2)
