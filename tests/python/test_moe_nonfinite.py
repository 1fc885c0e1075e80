"""Non-finite values in the MoE gate/up path (non-finite values propagate, are never hidden; an absent
clamp limit is unbounded). The rule (include/mxfp8.h, mxfp8_moe_config): clamp(NaN) = NaN; an absent limit
masks nothing; a present limit masks x <= lo / x >= hi with NaN counted as inside; act(NaN) = act'(NaN) = NaN.

A NaN in X[t, h] makes token t's g and u NaN (its quantization group along H is NaN), so hidden_states_grad[t] must
be NaN in every column -- on the kernel, both goldens and the numpy oracle -- and the other tokens' rows stay finite.
"""

import numpy as np
import pytest

import mxfp8
import moe_oracle as orc
from test_moe import ACTS, CLAMPS, GRADS, config, make, oracle_clamps

T, H, I, E, K, B = 30, 64, 32, 3, 2, 8
TOK, COL = 3, 5


def nan_rows(x):
    x = np.asarray(x, np.float32).reshape(x.shape[0], -1)
    return np.isnan(x).any(1), np.isnan(x).all(1)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("clamp", (False, True))
def test_nan_in_X_poisons_its_token(rng, act, clamp):
    p = make(rng, T, H, I, E, K, B)
    p["X"][TOK, COL] = np.nan
    cfg = config(act, clamp=clamp)
    args = (p["X"], p["a"], p["W1"], p["W2"], p["tp"], p["be"], p["dY"], p["B"])
    results = {
        "kernel": dict(zip(GRADS, mxfp8.blockwise_mm_bwd_mxfp8(*args, config=cfg))),
        "golden": dict(zip(GRADS, mxfp8.blockwise_mm_bwd_golden(*args, config=cfg))),
        "golden quantized": dict(zip(GRADS, mxfp8.blockwise_mm_bwd_golden(*args, config=cfg, quantized=True))),
        "oracle": orc.backward(*args, activation=act, clamps=oracle_clamps(clamp), quant=dict(fmt="e4m3")),
    }
    experts = set(int(e) for e in p["ids"][TOK])
    for who, g in results.items():
        anyn, alln = nan_rows(g["hidden_states_grad"])
        assert alln[TOK], f"{who}: hidden_states_grad[{TOK}] is not all NaN"
        assert not anyn[np.arange(T) != TOK].any(), f"{who}: NaN leaked into other tokens' hidden_states_grad"
        da = np.asarray(g["expert_affinities_masked_grad"], np.float64).reshape(T, E)
        for e in experts:
            assert np.isnan(da[TOK, e]), f"{who}: affinity grad of token {TOK}, expert {e} is not NaN"
            assert np.isnan(np.asarray(g["gate_up_proj_weight_grad"], np.float32)[e]).any(), who
        assert np.isfinite(np.delete(da, TOK, axis=0)).all(), who


@pytest.mark.parametrize("act", ACTS)
def test_nan_weight_reaches_forward_output(rng, act):
    """W1[0, 7, 0, 3] = NaN: every token routed to expert 0 gets NaN g[:, 3], so act(g) (SquaredReLU too) is NaN and
    the output row is NaN; tokens not routed to expert 0 stay finite."""
    p = make(rng, T, H, I, E, K, B)
    p["W1"][0, 7, 0, 3] = np.nan
    cfg = config(act)
    fargs = (p["X"], p["a"], p["W1"], p["W2"], p["tp"], p["be"], p["B"])
    routed = (p["ids"] == 0).any(1)
    y, _ = mxfp8.blockwise_mm_fwd_mxfp8(*fargs, config=cfg)
    yg, _ = mxfp8.blockwise_mm_fwd_golden(*fargs, config=cfg)
    yo, _ = orc.forward(*fargs, activation=act, quant=dict(fmt="e4m3"))
    for who, out in (("kernel", y), ("golden", yg), ("oracle", yo)):
        anyn, alln = nan_rows(out)
        assert alln[routed].all(), f"{who} ({act}): a token of expert 0 has a non-NaN output row"
        assert not anyn[~routed].any(), f"{who} ({act}): NaN in a token not routed to expert 0"


def test_nan_checkpoint_with_present_limits(rng):
    """g = NaN given through the checkpoint with all four limits present and u exactly at its lower limit: d_up is
    masked (u at a limit gets zero gradient), d_gate = dI * u * act'(NaN) is NaN (NaN counts as inside the gate
    limits), so NaN reaches hidden_states_grad of that token -- and only of that token."""
    p = make(rng, 20, 32, 16, 2, 1, 8)
    cfg = config(clamp=True)
    _, ck = mxfp8.blockwise_mm_fwd_mxfp8(p["X"], p["a"], p["W1"], p["W2"], p["tp"], p["be"], p["B"], config=cfg,
                                         checkpoints=("gate_up_proj_act_checkpoint_T",))
    tp = np.asarray(p["tp"]).reshape(-1, p["B"])
    n, q, i = 0, 2, 4
    t = int(tp[n, q])
    gu = ck["gate_up_proj_act_checkpoint_T"].copy()
    gu[n, 0, i, q] = np.nan
    gu[n, 1, i, q] = np.float32(oracle_clamps(True)[2])
    k = dict(zip(GRADS, mxfp8.blockwise_mm_bwd_mxfp8(p["X"], p["a"], p["W1"], p["W2"], p["tp"], p["be"], p["dY"],
                                                       p["B"], config=cfg, gate_up_proj_act_checkpoint_T=gu)))
    anyn, alln = nan_rows(k["hidden_states_grad"])
    assert alln[t], "a NaN gate value with limits present was masked away"
    assert anyn.sum() == 1


def test_oracle_clamp_pass():
    x = np.array([np.nan, -np.inf, np.inf, -1.0, 0.0, 1.0, 0.5])
    assert orc.clamp_pass(x, -np.inf, np.inf).all()  # absent limits mask nothing, not even +-Inf
    assert list(orc.clamp_pass(x, -1.0, 1.0)) == [True, False, False, False, True, False, True]
    assert list(orc.clamp_pass(x, -np.inf, 0.5)) == [True, True, False, True, True, False, False]
    g = np.array([np.nan])
    for act in ACTS:
        assert np.isnan(orc.act(act, g)).all() and np.isnan(orc.dact(act, g)).all(), act
    assert np.isnan(np.clip(g, -0.25, 0.5)).all()

