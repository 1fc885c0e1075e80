"""Blockwise MoE: router, forward and backward of libmxfp8 against the independent FP64 numpy oracle
(moe_oracle.py), which is itself checked against central finite differences of its FP64 forward.

Bound of the backward against the quantized oracle: normwise relative error <= 1e-4 per gradient. Both sides
quantize the same operands along the same axes; what differs is FP32 (ours) vs FP64 (oracle) arithmetic before each
quantization, which moves an FP8 code across a rounding boundary only rarely (each flip costs at most one FP8 ulp of
one element). The bound is >= 30x below the quantization effect itself (unquantized vs quantized oracle, asserted
> 3e-3 in the same tests), so a wrong axis, a missing quantization or a wrong formula cannot pass.
"""

import itertools

import ml_dtypes
import numpy as np
import pytest

import mxfp8
import moe_oracle as orc

GRADS = ("hidden_states_grad", "expert_affinities_masked_grad", "gate_up_proj_weight_grad", "down_proj_weight_grad",
         "gate_and_up_proj_bias_grad", "down_proj_bias_grad")
BOUND = 1e-4
ACTS = ("silu", "swish", "squared_relu")
AFFS = ("on_i", "on_h")
CLAMPS = dict(non_linear_clamp_lower_limit=-0.25, non_linear_clamp_upper_limit=0.5, linear_clamp_lower_limit=-0.3,
              linear_clamp_upper_limit=0.3)


def make(rng, T, H, I, E, K, B, pad=-1, counts=None, bias=False):
    X = rng.uniform(0, 1, (T, H)).astype(np.float32)
    dY = rng.uniform(-1, 1, (T, H)).astype(np.float32)
    W1 = rng.uniform(-0.1, 0.1, (E, H, 2, I)).astype(np.float32)
    W2 = rng.uniform(-0.1, 0.1, (E, I, H)).astype(np.float32)
    if counts is not None:
        ids = np.repeat(np.arange(E), counts).reshape(-1, 1).astype(np.int32)
    else:
        ids = np.array([rng.permutation(E)[:K] for _ in range(T)], np.int32).reshape(T, K)
    w = rng.uniform(0, 1, ids.shape).astype(np.float32)
    tp, be, a = mxfp8.route(ids, w, E, B, padding_id=pad)
    p = dict(X=X, dY=dY, W1=W1, W2=W2, tp=tp, be=be, a=a, B=B, ids=ids, w=w)
    if bias:
        p["b1"] = rng.uniform(-0.5, 0.5, (E, 2, I)).astype(np.float32)
        p["b2"] = rng.uniform(-0.5, 0.5, (E, H)).astype(np.float32)
    return p


def config(act="silu", aff="on_i", bias=False, clamp=False, **kw):
    return mxfp8.MXFP8MOEBwdConfig(activation_type=act, affinity_option="affinity_" + aff, bias=bias,
                                   clamp_limits=mxfp8.ClampLimits(**CLAMPS) if clamp else None, **kw)


def oracle_clamps(clamp):
    if not clamp:
        return (None, None, None, None)
    # the library's limits are float32 (include/mxfp8.h): the oracle clamps at the same values
    return tuple(float(np.float32(CLAMPS[k])) for k in ("non_linear_clamp_lower_limit", "non_linear_clamp_upper_limit",
                                                         "linear_clamp_lower_limit", "linear_clamp_upper_limit"))


def ours(p, cfg, **kw):
    g = mxfp8.blockwise_mm_bwd_mxfp8(p["X"], p["a"], p["W1"], p["W2"], p["tp"], p["be"], p["dY"], p["B"],
                                     config=cfg, gate_and_up_proj_bias=p.get("b1") if cfg.bias else None,
                                     down_proj_bias=p.get("b2") if cfg.bias else None, **kw)
    return dict(zip(GRADS, g))


def oracle(p, act="silu", aff="on_i", bias=False, clamp=False, quant=True, V=None, fmt="e4m3", rule="nki"):
    return orc.backward(p["X"], p["a"], p["W1"], p["W2"], p["tp"], p["be"], p["dY"], p["B"],
                        b1=p.get("b1") if bias else None, b2=p.get("b2") if bias else None, activation=act,
                        affinity=aff, clamps=oracle_clamps(clamp), V=V,
                        quant=dict(fmt=fmt, rule=rule) if quant else None)


def relerr(k, g):
    k = np.asarray(k, np.float64)
    g = np.asarray(g, np.float64)
    den = np.linalg.norm(g)
    return np.linalg.norm(k - g) / den if den > 0 else np.linalg.norm(k)


def assert_close(k, o, names, bound=BOUND, what=""):
    for n in names:
        r = relerr(k[n], o[n])
        assert r <= bound, f"{what} {n}: normwise relative error {r:.3g} > {bound}"


# ---------------------------------------------------------------------------------------------------------------
# The oracle itself: central finite differences of its FP64 forward (loss = sum(out * dY))
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("act,aff,bias,clamp", list(itertools.product(ACTS, AFFS, (False, True), (False, True))))
def test_oracle_vs_finite_differences(rng, act, aff, bias, clamp):
    T, H, I, E, K, B = 5, 4, 3, 3, 2, 2
    p = make(rng, T, H, I, E, K, B, bias=True)
    X, W1, W2, a, dY = (p[k].astype(np.float64) for k in ("X", "W1", "W2", "a", "dY"))
    X = X * 2 - 0.5  # both signs of g (SquaredReLU kink is avoided below)
    W1 = W1 * 10
    W2 = W2 * 10
    b1 = p["b1"].astype(np.float64) if bias else None
    b2 = p["b2"].astype(np.float64) if bias else None
    cl = (-0.4, 0.6, -0.5, 0.5) if clamp else (None, None, None, None)

    def loss(X_, a_, W1_, W2_, b1_, b2_):
        out, blocks = orc.forward(X_, a_, W1_, W2_, p["tp"], p["be"], B, b1=b1_, b2=b2_, activation=act, clamps=cl)
        return float((out * dY).sum()), blocks

    _, blocks = loss(X, a, W1, W2, b1, b2)
    # keep away from kinks (clamp limits, ReLU at 0), where the derivative is one-sided
    for blk in blocks:
        for v, lims in ((blk["g"], cl[:2]), (blk["u"], cl[2:])):
            v = v[blk["real"]]
            for lim in lims + ((0.0,) if act == "squared_relu" else ()):
                if lim is not None and v.size:
                    assert np.abs(v - lim).min() > 1e-4 or np.abs(v - lim).min() == 0, "too close to a kink"
    g = orc.backward(X, a, W1, W2, p["tp"], p["be"], dY, B, b1=b1, b2=b2, activation=act, affinity=aff, clamps=cl)
    h = 1e-6
    params = dict(X=X, a=a.reshape(-1), W1=W1, W2=W2)
    if bias:
        params.update(b1=b1, b2=b2)
    gname = dict(X="hidden_states_grad", a="expert_affinities_masked_grad", W1="gate_up_proj_weight_grad",
                 W2="down_proj_weight_grad", b1="gate_and_up_proj_bias_grad", b2="down_proj_bias_grad")
    for name, arr in params.items():
        num = np.zeros(arr.size)
        for i in range(arr.size):
            vals = []
            for s in (1, -1):
                q = {k: v.copy() for k, v in params.items()}
                q[name].reshape(-1)[i] += s * h
                vals.append(loss(q["X"], q["a"], q["W1"], q["W2"], q.get("b1"), q.get("b2"))[0])
            num[i] = (vals[0] - vals[1]) / (2 * h)
        ana = g[gname[name]].reshape(-1)
        if name == "a":  # only routed pairs are parameters of the layer; unrouted entries are 0 by definition
            routed = np.zeros(arr.size, bool)
            tp = p["tp"].reshape(-1)
            for n, e in enumerate(p["be"].reshape(-1)):
                for t in tp[n * B:(n + 1) * B]:
                    if t >= 0:
                        routed[t * E + e] = True
            assert np.all(ana[~routed] == 0)
            num, ana = num[routed], ana[routed]
        err = np.abs(num - ana).max()
        assert err <= 1e-6 * max(1.0, np.abs(num).max()), f"{name}: finite differences differ by {err:.3g}"


def test_router_vs_oracle(rng):
    for T, E, K, B in ((37, 4, 2, 8), (64, 3, 1, 32), (0, 3, 1, 16), (50, 8, 8, 7), (10, 5, 3, 1)):
        ids = np.array([rng.permutation(E)[:K] for _ in range(T)], np.int32).reshape(T, K)
        w = rng.uniform(0, 1, (T, K)).astype(np.float32)
        for pad in (-1, T):
            tp, be, a = mxfp8.route(ids, w, E, B, padding_id=pad)
            otp, obe, oa = orc.route(ids, w, E, B, pad=pad)
            assert mxfp8.num_blocks(T, K, E, B) == orc.num_blocks(T, K, E, B) == be.shape[0]
            np.testing.assert_array_equal(tp, otp)
            np.testing.assert_array_equal(be.ravel(), obe)
            np.testing.assert_array_equal(a.ravel(), oa)
    with pytest.raises(mxfp8.MXFP8Error) as ei:
        mxfp8.route(np.array([[0, 3]], np.int32), np.ones((1, 2), np.float32), 3, 4)
    assert ei.value.status == 8  # INDEX_OUT_OF_RANGE
    with pytest.raises(mxfp8.MXFP8Error):
        mxfp8.route(np.array([[1, 1]], np.int32), np.ones((1, 2), np.float32), 3, 4)


# ---------------------------------------------------------------------------------------------------------------
# Backward against the quantized oracle
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("act,aff,bias,clamp", list(itertools.product(ACTS, AFFS, (False, True), (False, True))))
def test_backward_vs_quantized_oracle(rng, act, aff, bias, clamp):
    p = make(rng, 40, 48, 40, 3, 2, 16, bias=True)  # H, I not multiples of 32
    k = ours(p, config(act, aff, bias, clamp))
    o = oracle(p, act, aff, bias, clamp)
    names = GRADS if bias else GRADS[:4]
    assert_close(k, o, names, what=f"{act}/{aff}/bias={bias}/clamp={clamp}")
    u = oracle(p, act, aff, bias, clamp, quant=False)
    assert relerr(o["hidden_states_grad"], u["hidden_states_grad"]) > 30 * BOUND  # the test can tell
    # the C golden references agree with the oracle
    G = mxfp8.blockwise_mm_bwd_golden(p["X"], p["a"], p["W1"], p["W2"], p["tp"], p["be"], p["dY"], p["B"],
                                      config=config(act, aff, bias, clamp), quantized=True,
                                      gate_and_up_proj_bias=p.get("b1") if bias else None,
                                      down_proj_bias=p.get("b2") if bias else None)
    assert_close(dict(zip(GRADS, G)), o, names, bound=1e-6, what="quantized golden")
    G = mxfp8.blockwise_mm_bwd_golden(p["X"], p["a"], p["W1"], p["W2"], p["tp"], p["be"], p["dY"], p["B"],
                                      config=config(act, aff, bias, clamp), quantized=False,
                                      gate_and_up_proj_bias=p.get("b1") if bias else None,
                                      down_proj_bias=p.get("b2") if bias else None)
    assert_close(dict(zip(GRADS, G)), u, names, bound=1e-12, what="unquantized golden")


@pytest.mark.parametrize("fmt,rule", [("e5m2", "nki"), ("e4m3", "ocp"), ("e4m3", "rceil")])
def test_formats_and_rules(rng, fmt, rule):
    p = make(rng, 24, 40, 24, 2, 1, 16)
    k = ours(p, config(fp8_x4_dtype={"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}[fmt], scale_rule=rule))
    assert_close(k, oracle(p, fmt=fmt, rule=rule), GRADS[:4], what=f"{fmt}/{rule}")


def test_forward_vs_oracle(rng):
    p = make(rng, 30, 40, 24, 3, 2, 8, bias=True)
    for act, clamp in itertools.product(ACTS, (False, True)):
        cfg = config(act, bias=True, clamp=clamp)
        y, ck = mxfp8.blockwise_mm_fwd_mxfp8(p["X"], p["a"], p["W1"], p["W2"], p["tp"], p["be"], p["B"], config=cfg,
                                             gate_and_up_proj_bias=p["b1"], down_proj_bias=p["b2"],
                                             checkpoints="all")
        out, blocks = orc.forward(p["X"], p["a"], p["W1"], p["W2"], p["tp"], p["be"], p["B"], b1=p["b1"], b2=p["b2"],
                                  activation=act, clamps=oracle_clamps(clamp), quant=dict(fmt="e4m3"))
        assert relerr(y, out) <= BOUND
        g = np.stack([np.stack([b["g"].T, b["u"].T]) for b in blocks])
        assert relerr(ck["gate_up_proj_act_checkpoint_T"], g) <= 1e-6
        inter = np.stack([b["inter"].T for b in blocks])
        assert relerr(ck["intermediate_checkpoint_T"], inter) <= 1e-6
        assert relerr(ck["scaled_intermediate_checkpoint_T"], np.stack([(b["ab"][:, None] * b["inter"]).T
                                                                        for b in blocks])) <= 1e-6
        assert relerr(ck["down_proj_output_checkpoint"], np.stack([b["down"] for b in blocks])) <= BOUND


def test_clamp_values_exactly_at_a_limit(rng):
    """g and u exactly at a limit (given through the checkpoint) get zero gradient (strict masks)."""
    p = make(rng, 20, 32, 16, 2, 1, 8)
    cfg = config(clamp=True)
    y, ck = mxfp8.blockwise_mm_fwd_mxfp8(p["X"], p["a"], p["W1"], p["W2"], p["tp"], p["be"], p["B"], config=cfg,
                                         checkpoints=("gate_up_proj_act_checkpoint_T",))
    gu = ck["gate_up_proj_act_checkpoint_T"].copy()  # [N, 2, I, B]
    lims = oracle_clamps(True)
    sel = rng.uniform(0, 1, gu.shape) < 0.3
    choice = rng.integers(0, 2, gu.shape)
    gate_lim = np.where(choice == 0, lims[0], lims[1]).astype(np.float32)
    up_lim = np.where(choice == 0, lims[2], lims[3]).astype(np.float32)
    gu[:, 0] = np.where(sel[:, 0], gate_lim[:, 0], gu[:, 0])
    gu[:, 1] = np.where(sel[:, 1], up_lim[:, 1], gu[:, 1])
    k = ours(p, cfg, gate_up_proj_act_checkpoint_T=gu)
    B = p["B"]

    def override(n):
        return gu[n, 0].T.astype(np.float64).copy(), gu[n, 1].T.astype(np.float64).copy()
    o = orc.backward(p["X"], p["a"], p["W1"], p["W2"], p["tp"], p["be"], p["dY"], B, clamps=lims,
                     quant=dict(fmt="e4m3"), gu_override=override)
    assert_close(k, o, GRADS[:4], what="values at a limit")
    # and the mask matters: treating the limit as inside gives a different result
    o2 = orc.backward(p["X"], p["a"], p["W1"], p["W2"], p["tp"], p["be"], p["dY"], B,
                      clamps=tuple(v - 1e-3 if i % 2 == 0 else v + 1e-3 for i, v in enumerate(lims)),
                      quant=dict(fmt="e4m3"), gu_override=override)
    assert relerr(k["gate_up_proj_weight_grad"], o2["gate_up_proj_weight_grad"]) > 30 * BOUND


# ---------------------------------------------------------------------------------------------------------------
# Checkpoints, pre-quantized weights, threads: bitwise
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("aff", AFFS)
def test_checkpoints_bitwise(rng, aff):
    p = make(rng, 36, 40, 24, 3, 2, 16, bias=True)
    cfg = config(aff=aff, bias=True, clamp=True)
    y, ck = mxfp8.blockwise_mm_fwd_mxfp8(p["X"], p["a"], p["W1"], p["W2"], p["tp"], p["be"], p["B"], config=cfg,
                                         gate_and_up_proj_bias=p["b1"], down_proj_bias=p["b2"], checkpoints="all")
    # down_proj_act_checkpoint = a * dY[t] in float32, 0 at padding
    tp = p["tp"].reshape(-1, p["B"])
    be = p["be"].ravel()
    E = p["W1"].shape[0]
    dact = np.zeros((tp.shape[0], p["B"], p["X"].shape[1]), np.float32)
    for n in range(tp.shape[0]):
        for q, t in enumerate(tp[n]):
            if t >= 0:
                dact[n, q] = p["a"][t * E + be[n], 0] * p["dY"][t]
    ck["down_proj_act_checkpoint"] = dact
    ref = ours(p, cfg)
    names = list(ck)
    for r in range(1, len(names) + 1):
        for combo in itertools.combinations(names, r):
            k = ours(p, cfg, **{c: ck[c] for c in combo})
            for g in GRADS:
                assert np.array_equal(k[g], ref[g]), f"{combo}: {g} differs from recomputing"


@pytest.mark.parametrize("aff", AFFS)
def test_prequantized_weights_bitwise(rng, aff):
    p = make(rng, 30, 72, 20, 2, 1, 8)
    E, H, _, I = p["W1"].shape
    cfg = config(aff=aff)
    # forward: W1 along H, W2 along I
    c1, s1 = mxfp8.quantize(p["W1"], "e4m3", axis=1)
    c2, s2 = mxfp8.quantize(p["W2"], "e4m3", axis=1)
    y0, ck = mxfp8.blockwise_mm_fwd_mxfp8(p["X"], p["a"], p["W1"], p["W2"], p["tp"], p["be"], p["B"], config=cfg,
                                          checkpoints=("gate_up_proj_act_checkpoint_T", "down_proj_output_checkpoint"))
    y1, _ = mxfp8.blockwise_mm_fwd_mxfp8(p["X"], p["a"], c1, c2, p["tp"], p["be"], p["B"], config=cfg,
                                         gate_up_weight_scales=s1, down_weight_scales=s2)
    assert np.array_equal(y0, y1)
    # backward: W1 along 2I, W2 along H (checkpoints given so nothing is re-quantized along another axis)
    d1, t1 = mxfp8.quantize(p["W1"].reshape(E, H, 2 * I), "e4m3", axis=2)
    d2, t2 = mxfp8.quantize(p["W2"], "e4m3", axis=2)
    k0 = ours(p, cfg, **ck)
    q = dict(p, W1=d1.reshape(E, H, 2, I), W2=d2)
    k1 = ours(q, cfg, gate_up_weight_scales=t1, down_weight_scales=t2, **ck)
    for g in GRADS[:4]:
        assert np.array_equal(k0[g], k1[g]), g


def test_threads_bitwise(rng):
    # large enough that every phase splits between threads (small work runs on one thread)
    p = make(rng, 400, 256, 128, 3, 2, 256, bias=True)
    cfg = config(bias=True)
    mxfp8.set_num_threads(1)
    try:
        k1 = ours(p, cfg)
        mxfp8.set_num_threads(2)
        k2 = ours(p, cfg)
    finally:
        mxfp8.set_num_threads(0)
    for g in GRADS:
        assert np.array_equal(k1[g], k2[g]), g


# ---------------------------------------------------------------------------------------------------------------
# Edge cases
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("B", [32, 64])
def test_expert_without_tokens(rng, B):
    p = make(rng, 64, 40, 24, 3, 1, B, counts=[44, 0, 20], bias=True)
    k = ours(p, config(bias=True))
    assert_close(k, oracle(p, bias=True), GRADS, what=f"counts [44, 0, 20], B={B}")
    assert np.all(k["gate_up_proj_weight_grad"][1] == 0) and np.all(k["down_proj_weight_grad"][1] == 0)
    assert np.all(k["gate_and_up_proj_bias_grad"][1] == 0) and np.all(k["down_proj_bias_grad"][1] == 0)
    for g in GRADS:
        assert np.all(np.isfinite(k[g]))


@pytest.mark.parametrize("B", [1, 32, 100])
def test_block_sizes(rng, B):
    p = make(rng, 50, 33, 17, 4, 2, B)
    assert_close(ours(p, config()), oracle(p), GRADS[:4], what=f"B={B}")


def test_zero_tokens(rng):
    p = make(rng, 0, 32, 16, 3, 1, 16)
    assert p["be"].shape[0] == 2  # E - 1 padding-only blocks
    k = ours(p, config())
    assert k["hidden_states_grad"].shape == (0, 32)
    assert np.all(k["gate_up_proj_weight_grad"] == 0) and np.all(k["down_proj_weight_grad"] == 0)


def test_padding_conventions(rng):
    """Blocks made only of padding, with padding -1 (skip_token) and T (zero row): same gradients as the oracle and
    bitwise equal to each other."""
    p = make(rng, 24, 40, 24, 4, 1, 16)
    T = p["X"].shape[0]
    q = dict(p, tp=np.where(p["tp"] == -1, T, p["tp"]).astype(np.int32))
    tp = p["tp"].reshape(-1, 16)
    assert np.sum(np.all(tp == -1, axis=1)) >= 1
    k1 = ours(p, config())
    k2 = ours(q, config(skip_dma=mxfp8.SkipMode(skip_token=False)))
    for g in GRADS[:4]:
        assert np.array_equal(k1[g], k2[g]), g
    assert_close(k1, oracle(p), GRADS[:4])
    # the router writes the T convention too
    tp2, _, _ = mxfp8.route(p["ids"], p["w"], 4, 16, padding_id=T)
    np.testing.assert_array_equal(tp2, q["tp"])


def test_dense_num_valid_tokens(rng):
    T, H, I, B, V = 50, 40, 24, 16, 37
    p = make(rng, T, H, I, 1, 1, B)
    cfg = config(single_expert_dense=True)
    hs = np.full((T, H), 7.0, np.float32)
    g = mxfp8.blockwise_mm_bwd_mxfp8(p["X"], p["a"], p["W1"], p["W2"], None, None, p["dY"], B, config=cfg,
                                     num_valid_tokens=np.array([V], np.int32))
    k = dict(zip(GRADS, g))
    assert np.all(k["hidden_states_grad"][V:] == 0) and np.all(k["expert_affinities_masked_grad"][V:] == 0)
    N = -(-T // B)
    tp = np.where(np.arange(N * B) < V, np.arange(N * B), -1)
    o = orc.backward(p["X"], p["a"], p["W1"], p["W2"], tp, np.zeros(N, np.int64), p["dY"], B,
                     quant=dict(fmt="e4m3"))
    assert_close(k, o, GRADS[:4], what="dense + num_valid_tokens")
    # values above T clamp to T
    g2 = mxfp8.blockwise_mm_bwd_mxfp8(p["X"], p["a"], p["W1"], p["W2"], None, None, p["dY"], B, config=cfg,
                                      num_valid_tokens=np.array([10 * T], np.int32))
    g3 = mxfp8.blockwise_mm_bwd_mxfp8(p["X"], p["a"], p["W1"], p["W2"], None, None, p["dY"], B, config=cfg)
    for x, y in zip(g2, g3):
        assert np.array_equal(x, y)
    del hs


def test_accumulate_into_given_buffers(rng):
    p = make(rng, 30, 40, 24, 3, 2, 16, bias=True)
    fresh = ours(p, config(bias=True))
    bufs = {g: rng.uniform(-1, 1, fresh[g].shape).astype(np.float32) for g in GRADS if g != GRADS[1]}
    given = {g: b.copy() for g, b in bufs.items()}
    k = ours(p, config(bias=True, accumulate_hidden_states_grad=True, skip_grad_initialization=True), **given)
    assert k["hidden_states_grad"] is given["hidden_states_grad"]  # written in place
    for g in bufs:
        np.testing.assert_array_equal(k[g], bufs[g] + fresh[g], err_msg=g)
    np.testing.assert_array_equal(k[GRADS[1]], fresh[GRADS[1]])


# ---------------------------------------------------------------------------------------------------------------
# Bad input: a clear error, every output untouched
# ---------------------------------------------------------------------------------------------------------------
def test_bad_input(rng):
    p = make(rng, 20, 32, 16, 3, 2, 8)
    T = 20

    def expect(status, **over):
        q = dict(p, **{k: v for k, v in over.items() if k in p})
        cfg = over.get("cfg", config(accumulate_hidden_states_grad=True, skip_grad_initialization=True))
        bufs = dict(hidden_states_grad=np.full((T, 32), 3.0, np.float32),
                    gate_up_proj_weight_grad=np.full(p["W1"].shape, 3.0, np.float32),
                    down_proj_weight_grad=np.full(p["W2"].shape, 3.0, np.float32))
        kw = {k: v for k, v in over.items() if k not in p and k != "cfg"}
        with pytest.raises(mxfp8.MXFP8Error) as ei:
            mxfp8.blockwise_mm_bwd_mxfp8(q["X"], q["a"], q["W1"], q["W2"], q["tp"], q["be"], q["dY"], q["B"],
                                         config=cfg, **bufs, **kw)
        assert ei.value.status == status, ei.value
        assert len(ei.value.message) > 20
        for b in bufs.values():
            assert np.all(b == 3.0), "an output was written"
        return ei.value

    for bad in (-2, T + 1, T):
        tp = p["tp"].copy()
        tp[3] = bad
        e = expect(8, tp=tp)
        assert "token_position_to_id" in e.message
    tp = p["tp"].copy()
    tp[np.where(tp == -1)[0][0] if np.any(tp == -1) else 0] = -1
    tp[0] = -1
    expect(8, tp=tp, cfg=config(skip_dma=mxfp8.SkipMode(skip_token=False)))  # -1 in the T convention
    be = p["be"].copy()
    be[1] = 3
    assert "block_to_expert" in expect(8, be=be).message
    expect(3, dY=p["dY"][:, :31])
    expect(3, W2=p["W2"][:, :15])
    expect(3, a=p["a"][:-1])
    expect(3, tp=p["tp"][:-1])
    expect(2, num_valid_tokens=np.array([5], np.int32))  # without single_expert_dense
    expect(2, B=0)


# ---------------------------------------------------------------------------------------------------------------
# The upstream problem and the NKI criteria (run once: it is big)
# ---------------------------------------------------------------------------------------------------------------
def test_upstream_problem_nki_criteria():
    rng = np.random.default_rng(42)
    H, T, E, B, K, I = 1024, 1024, 4, 512, 4, 256
    bf16 = ml_dtypes.bfloat16
    W1 = rng.uniform(-0.1, 0.1, (E, H, 2, I)).astype(bf16)
    W2 = rng.uniform(-0.1, 0.1, (E, I, H)).astype(bf16)
    X = rng.uniform(0, 1, (T, H)).astype(bf16)
    dY = rng.uniform(-1, 1, (T, H)).astype(bf16)
    ids = np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int32)
    w = rng.uniform(0, 1, (T, K)).astype(np.float32)
    tp, be, a = mxfp8.route(ids, w, E, B, affinity_dtype=bf16)
    _, ck = mxfp8.blockwise_mm_fwd_mxfp8(X, a, W1, W2, tp, be, B)
    g = dict(zip(GRADS, mxfp8.blockwise_mm_bwd_mxfp8(X, a, W1, W2, tp, be, dY, B, **ck)))
    f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731
    golden = orc.backward(f32(X), f32(a), f32(W1), f32(W2), tp, be, f32(dY), B)
    for name in GRADS[:4]:
        c = orc.nki_criteria(g[name], golden[name])
        assert c["passed"], f"{name}: {c}"
        assert c["cosine"] > 0.995, f"{name}: {c}"


def test_strided_views_and_dtypes(rng):
    """Non-contiguous inputs/outputs give bitwise the contiguous result; BF16 inputs and BF16 checkpoints work."""
    p = make(rng, 30, 40, 24, 3, 2, 16, bias=True)
    cfg = config(bias=True, aff="on_h")
    ref = ours(p, cfg)

    def strided(x):  # same values, every other element of a twice-as-wide buffer (negative row stride too)
        big = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), x.dtype)
        big[..., ::2] = x
        return big[..., ::2]
    q = {k: (strided(v) if k in ("X", "dY", "W1", "W2", "b1", "b2") else v) for k, v in p.items()}
    q["X"] = np.ascontiguousarray(p["X"][::-1])[::-1]
    assert not q["X"].flags.c_contiguous and not q["W1"].flags.c_contiguous
    bufs = {g: strided(np.zeros_like(ref[g])) for g in ("hidden_states_grad", "gate_up_proj_weight_grad",
                                                         "down_proj_weight_grad", "gate_and_up_proj_bias_grad",
                                                         "down_proj_bias_grad")}
    k = ours(q, cfg, **bufs)
    for g in GRADS:
        assert np.array_equal(k[g], ref[g]), g
    # BF16 everywhere (inputs, checkpoints, gradients)
    bf = {k2: (v.astype(ml_dtypes.bfloat16) if getattr(v, "dtype", None) == np.float32 else v)
          for k2, v in p.items()}
    cfgi = config(bias=True)
    _, ck = mxfp8.blockwise_mm_fwd_mxfp8(bf["X"], bf["a"], bf["W1"], bf["W2"], bf["tp"], bf["be"], bf["B"],
                                         config=cfgi, gate_and_up_proj_bias=bf["b1"], down_proj_bias=bf["b2"],
                                         checkpoints="all", checkpoint_dtype=ml_dtypes.bfloat16)
    k = ours(bf, cfgi, **ck)
    assert k["hidden_states_grad"].dtype == ml_dtypes.bfloat16
    o = oracle({k2: (v.astype(np.float32) if getattr(v, "dtype", None) == ml_dtypes.bfloat16 else v)
                for k2, v in bf.items()}, bias=True)
    # BF16 gradients alone cost ~2^-9; BF16 checkpoints move a few percent of the FP8 codes of the operands
    # built from them by one step (a flip is ~6% of one element): about 1-2% normwise, measured up to 2.0e-2
    for g in GRADS:
        assert relerr(k[g], o[g]) <= 5e-2, g
    k = ours(bf, cfgi)  # without checkpoints only the BF16 rounding of the gradients remains
    for g in GRADS:
        assert relerr(k[g], o[g]) <= 4e-3, g


def test_config_fields(rng):
    """Seed field names and value forms; bad values raise ValueError naming the field; hardware knobs are inert."""
    import enum

    class ActFnType(enum.Enum):  # the NKI enum's shape (member names)
        SiLU = 0
        GELU = 1
        Swish = 3
    p = make(rng, 20, 32, 16, 2, 1, 8)
    ref = ours(p, config("swish"))
    k = ours(p, mxfp8.MXFP8MOEBwdConfig(activation_type=ActFnType.Swish, fp8_x4_dtype="float8_e4m3fn_x4",
                                         compute_dtype=ml_dtypes.bfloat16, shard_option="shard_on_block",
                                         fast_dma_transpose=True, pe_transpose_only=True, phase3_transpose_mode="dma",
                                         output_grad_swizzle_mode="dgt",
                                         phase1_config=mxfp8.MatmulMxfp8KernelConfig(tile_m=64, tile_n=64)))
    for g in GRADS[:4]:
        assert np.array_equal(k[g], ref[g]), g
    for bad, field in ((dict(activation_type=ActFnType.GELU), "activation_type"),
                       (dict(affinity_option="on_x"), "affinity_option"),
                       (dict(compute_dtype="float16"), "compute_dtype"),
                       (dict(clamp_limits=mxfp8.ClampLimits(linear_clamp_upper_limit=float("nan"))), "clamp_limits"),
                       # unknown values of the hardware knobs and flags are errors, not silently accepted
                       (dict(phase3_transpose_mode="bogus"), "phase3_transpose_mode"),
                       (dict(phase4_transpose_mode=7), "phase4_transpose_mode"),
                       (dict(bias=2), "bias"),
                       (dict(single_expert_dense=-1), "single_expert_dense"),
                       (dict(fast_dma_transpose=5), "fast_dma_transpose"),
                       (dict(skip_dma=mxfp8.SkipMode(skip_token=3)), "skip_token")) + tuple(
                          (dict(**{f: "bogus"}), f) for f in mxfp8.moe.SWIZZLE_FIELDS):
        with pytest.raises(ValueError, match=field):
            ours(p, mxfp8.MXFP8MOEBwdConfig(**bad))
    for bad, field in ((dict(accumulate_hidden_states_grad="no"), "accumulate_hidden_states_grad"),
                       (dict(skip_grad_initialization=None), "skip_grad_initialization"),
                       (dict(pe_transpose_only="yes"), "pe_transpose_only")):
        with pytest.raises(TypeError, match=field):
            ours(p, mxfp8.MXFP8MOEBwdConfig(**bad))
    for ok in (dict(phase4_transpose_mode="pe", bias=np.bool_(False), d_gate_up_swizzle_mode="dma"),
               dict(phase3_transpose_mode="nc", single_expert_dense=0, scaled_intermediate_t_swizzle_mode="pe")):
        k = ours(p, mxfp8.MXFP8MOEBwdConfig(activation_type="swish", **ok))
        assert all(np.array_equal(k[g], ref[g]) for g in GRADS[:4])
    with pytest.raises(mxfp8.MXFP8Error) as ei:  # lower > upper is the library's check
        ours(p, mxfp8.MXFP8MOEBwdConfig(clamp_limits=mxfp8.ClampLimits(linear_clamp_lower_limit=1.0,
                                                                       linear_clamp_upper_limit=0.0)))
    assert ei.value.status == 2
    with pytest.raises(mxfp8.MXFP8Error) as ei:
        ours(p, mxfp8.MXFP8MOEBwdConfig(phase3_config=mxfp8.MatmulMxfp8KernelConfig(quant_scheme="wrapx")))
    assert ei.value.status == 9  # UNSUPPORTED


def test_weight_size_disagreement_names_both(rng):
    """E and I come from gate_up_proj_weight, H from hidden_states: a disagreement names both tensors and the size,
    so the message does not blame down_proj_weight when gate_up_proj_weight is the bad one."""
    p = make(rng, 20, 32, 16, 2, 1, 8)
    args = lambda W1, W2: (p["X"], p["a"], W1, W2, p["tp"], p["be"], p["dY"], p["B"])  # noqa: E731
    cases = ((p["W1"][:, :, :, :-1], p["W2"], "gate_up_proj_weight has I = 15 but down_proj_weight has I = 16"),
             (p["W1"], p["W2"][:, :-1], "gate_up_proj_weight has I = 16 but down_proj_weight has I = 15"),
             (p["W1"][:1], p["W2"], "gate_up_proj_weight has E = 1 but down_proj_weight has E = 2"),
             (p["W1"][:, :-1], p["W2"], "hidden_states has H = 32 but gate_up_proj_weight has H = 31"),
             (p["W1"], p["W2"][:, :, :-1], "hidden_states has H = 32 but down_proj_weight has H = 31"))
    for W1, W2, msg in cases:
        for fn in (mxfp8.blockwise_mm_bwd_mxfp8, mxfp8.blockwise_mm_bwd_golden):
            with pytest.raises(mxfp8.MXFP8Error) as ei:
                fn(*args(np.ascontiguousarray(W1), np.ascontiguousarray(W2)))
            assert ei.value.status == 3 and msg in str(ei.value), str(ei.value)


def test_forward_validate_entry_sizes_the_call(rng):
    """mxfp8_moe_forward_validate through ctypes: the call's error (same status and message) for a bad block size;
    on good arguments the workspace bytes, and the thread's workspace reserved to exactly them serves the call
    without growing (mxfp8_workspace_bytes stays the reservation) with the same output bits."""
    import ctypes
    from mxfp8 import _lib
    from mxfp8 import moe as M
    p = make(rng, 40, 64, 32, 3, 2, 8, bias=True)
    cfg = config(bias=True)

    def fwd(fn, B, extra=()):
        return M._fwd_call(fn, p["X"], p["a"], p["W1"], p["W2"], p["tp"], p["be"], B, cfg, None, None, None,
                           p["b1"], p["b2"], ("gate_up_proj_act_checkpoint_T",), np.float32, np.float32, extra)

    size = ctypes.c_size_t(7)
    errors = []
    for fn, extra in (("mxfp8_moe_forward_validate", (ctypes.byref(size),)), ("mxfp8_moe_forward", ())):
        with pytest.raises(mxfp8.MXFP8Error) as e:
            fwd(fn, 9, extra)  # 9 does not divide token_position_to_id's length
        errors.append((e.value.status, e.value.message))
    assert errors[0] == errors[1] and "not a multiple of block_size 9" in errors[0][1], errors
    assert size.value == 0
    fwd("mxfp8_moe_forward_validate", 8, (ctypes.byref(size),))
    assert size.value > 0
    y0, ck0 = fwd("mxfp8_moe_forward", 8)
    ws = _lib.workspace()
    _lib.call("mxfp8_workspace_reserve", ws, size.value)
    held = _lib.function("mxfp8_workspace_bytes")(ws)
    assert held == (size.value + 63) // 64 * 64
    y1, ck1 = fwd("mxfp8_moe_forward", 8)
    assert _lib.function("mxfp8_workspace_bytes")(ws) == held, "the call grew a workspace reserved to its size"
    assert y0.tobytes() == y1.tobytes()
    assert ck0["gate_up_proj_act_checkpoint_T"].tobytes() == ck1["gate_up_proj_act_checkpoint_T"].tobytes()
