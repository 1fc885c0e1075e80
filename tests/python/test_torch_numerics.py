"""mxfp8.torch numerics: the gpt-oss SwiGLU activation of BlockwiseMoE against an FP64 reference written here (plain
torch autograd on the unquantized layer) and bitwise against the numpy-level calls; stochastic rounding of the MoE
operands (reproducible, equal to the numpy level); the collect_stats context manager over a training step (labels
per module, outputs and gradients bitwise unchanged, counts equal to the library's own per-call statistics)."""

import math

import numpy as np
import pytest
import torch

import mxfp8
import mxfp8.torch as mt
from torch_helpers import cosine, from_np, same_bits, to_np

T, H, I, E, K, BS = 48, 64, 40, 4, 2, 8


def fp64_gpt_oss(x, router_w, w1, w3, w2, top_k, alpha, limit):
    """The unquantized layer in FP64 with gpt-oss's clamped SwiGLU: g = min(x w1^T, limit), u = clamp(x w3^T,
    -limit, limit), inter = g sigmoid(alpha g) (u + 1)."""
    probs = torch.softmax(x @ router_w.T, dim=-1)
    top, ids = torch.topk(probs, top_k, dim=-1)
    wts = top / top.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    clamped = 0
    for e in range(w1.shape[0]):
        rows, slot = (ids == e).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        g0, u0 = x[rows] @ w1[e].T, x[rows] @ w3[e].T
        g, u = torch.clamp(g0, max=limit), torch.clamp(u0, -limit, limit)
        clamped += int((g != g0).sum() + (u != u0).sum())
        y = (g * torch.sigmoid(alpha * g) * (u + 1)) @ w2[e].T
        out = out.index_add(0, rows, wts[rows, slot, None] * y)
    return out, clamped


def _params(rng):
    def u(*shape, fan):
        return torch.from_numpy(rng.uniform(-1, 1, shape) / math.sqrt(fan))
    return dict(router=u(E, H, fan=H) * 4, w1=u(E, I, H, fan=H), w3=u(E, I, H, fan=H), w2=u(E, H, I, fan=I))


def _module(p, **kw):
    m = mt.BlockwiseMoE(H, I, E, K, block_size=BS, activation="gpt_oss_swiglu", recipe="nki", **kw)
    m.load_mixtral_weights(p["router"], p["w1"], p["w3"], p["w2"])
    return m.float()


def _numpy_calls(m, x, dy):
    ids, w = m.route_tokens(x)
    tp, be, a = mxfp8.route(ids.numpy(), w.detach().numpy(), E, BS)
    cfg = mxfp8.MXFP8MOEBwdConfig(activation_type="gpt_oss_swiglu", swiglu_alpha=m.swiglu_alpha,
                                  swiglu_limit=m.swiglu_limit, fp8_x4_dtype="float8_e4m3fn", scale_rule="nki",
                                  stochastic_rounding=m.stochastic_rounding or (), rounding_seed=m.rounding_seed)
    args = (to_np(x), a, to_np(m.gate_up_proj_weight), to_np(m.down_proj_weight), tp, be)
    y, _ = mxfp8.blockwise_mm_fwd_mxfp8(*args, BS, config=cfg, checkpoints=())
    g = mxfp8.blockwise_mm_bwd_mxfp8(*args, to_np(dy), BS, config=cfg, grad_dtype=np.float32)
    return from_np(y), [from_np(t) for t in g]


@pytest.mark.parametrize("alpha,limit", [(1.702, 7.0), (1.2, 1.0)])
def test_gpt_oss_swiglu_module_vs_fp64_and_numpy(rng, alpha, limit):
    p = _params(rng)
    m = _module(p, swiglu_alpha=alpha, swiglu_limit=limit)
    x = torch.from_numpy(np.abs(rng.standard_normal((T, H))).astype(np.float32)).requires_grad_()
    dy = torch.from_numpy(rng.standard_normal((T, H)).astype(np.float32))
    out = m(x)
    out.backward(dy)
    q = {k: v.clone().requires_grad_() for k, v in p.items()}
    x64 = x.detach().double().requires_grad_()
    ref, clamped = fp64_gpt_oss(x64, q["router"], q["w1"], q["w3"], q["w2"], K, alpha, limit)
    assert (clamped > 20) == (limit < 2), clamped  # the small limit clamps many values, 7 none
    ref.backward(dy.double())
    gu, down = m.gate_up_proj_weight.grad, m.down_proj_weight.grad
    for got, want, name in [(out, ref, "output"), (x.grad, x64.grad, "hidden_states"),
                            (m.router.weight.grad, q["router"].grad, "router"),
                            (gu[:, :, 0], q["w1"].grad.transpose(1, 2), "w1"),
                            (gu[:, :, 1], q["w3"].grad.transpose(1, 2), "w3"),
                            (down, q["w2"].grad.transpose(1, 2), "w2")]:
        assert cosine(got, want) >= 0.99, f"{name}: cosine {cosine(got, want):.5f}"
    y_np, g_np = _numpy_calls(m, x.detach(), dy)
    assert same_bits(out.detach(), y_np)
    assert same_bits(gu, g_np[2]) and same_bits(down, g_np[3])


def test_moe_stochastic_rounding_reproducible_and_equal_to_numpy(rng):
    p = _params(rng)
    x = torch.from_numpy(rng.standard_normal((T, H)).astype(np.float32))
    dy = torch.from_numpy(rng.standard_normal((T, H)).astype(np.float32))

    def step(**kw):
        m = _module(p, **kw)
        xx = x.clone().requires_grad_()
        out = m(xx)
        out.backward(dy)
        return m, out.detach(), xx.grad, m.gate_up_proj_weight.grad

    m, y1, gx1, gw1 = step(stochastic_rounding="gradients", rounding_seed=2**64 - 5)
    _, y2, gx2, gw2 = step(stochastic_rounding="gradients", rounding_seed=2**64 - 5)
    assert same_bits(y1, y2) and same_bits(gx1, gx2) and same_bits(gw1, gw2), "same seed, same bits"
    _, y0, gx0, gw0 = step()
    assert same_bits(y0, y1), "the forward's operands are rounded to nearest (only gradients are stochastic)"
    assert not same_bits(gw0, gw1) and cosine(gw0, gw1) > 0.99
    _, _, _, gw3 = step(stochastic_rounding="gradients", rounding_seed=1)
    assert not same_bits(gw1, gw3), "another seed, other bits"
    y_np, g_np = _numpy_calls(m, x, dy)
    assert same_bits(y1, y_np) and same_bits(gw1, g_np[2])  # (x.grad also holds the router's part)
    with pytest.raises(ValueError, match="stochastic_rounding"):
        _module(p, stochastic_rounding=["p1_dy", "nope"])
    with pytest.raises(ValueError, match="rounding_seed"):
        _module(p, rounding_seed=-1)
    with pytest.raises(ValueError, match="swiglu"):
        _module(p, swiglu_limit=0.0)


class _Net(torch.nn.Module):
    def __init__(self, p):
        super().__init__()
        self.proj = mt.MXFP8Linear(H, H, bias=False, recipe="mxfp8")
        self.moe = _module(p)

    def forward(self, x):
        return self.moe(self.proj(x))


def test_collect_stats_over_a_training_step(rng):
    torch.manual_seed(0)
    net = _Net(_params(rng))
    x = torch.from_numpy(rng.standard_normal((T, H)).astype(np.float32))
    dy = torch.from_numpy(rng.standard_normal((T, H)).astype(np.float32))

    def step():
        net.zero_grad()
        out = net(x)
        out.backward(dy)
        return out.detach(), [q.grad.clone() for q in net.parameters()]

    y0, g0 = step()
    with mt.collect_stats(net) as st:
        y1, g1 = step()
    assert same_bits(y0, y1) and all(same_bits(a, b) for a, b in zip(g0, g1)), "statistics change no bit"
    assert set(st.records) == {"proj", "moe"}, {k: {c: list(o) for c, o in v.items()} for k, v in st.records.items()}
    lin = st.records["proj"]
    assert set(lin) == {"matmul", "matmul_backward"}
    assert set(lin["matmul_backward"]) == set(mxfp8.BWD_QUANTIZATIONS)
    # the forward's input statistics are those of quantizing x along K as the recipe does (E4M3, rceil)
    _, _, want = mxfp8.quantize(x.numpy(), "e4m3", -1, "rceil", stats=True)
    got = lin["matmul"]["input_activation"]
    for k in ("elements", "saturated", "flushed_to_zero", "subnormal", "zero_groups", "scale_histogram"):
        assert got[k] == want[k], k
    assert got["sqnr_db"] == pytest.approx(want["sqnr_db"], rel=1e-12)
    moe = st.records["moe"]
    assert set(moe) == {"moe_forward", "moe_backward"}
    assert "expert0.gemm1_x" in moe["moe_forward"] and "expert0.p1_dy" in moe["moe_backward"]
    # X enters GEMM 1 once per (token, chosen expert): H values each (padding positions are not counted)
    assert sum(s["elements"] for k, s in moe["moe_forward"].items() if k.endswith(".gemm1_x")) == T * K * H
    assert "proj" in st.table() and "expert0.p1_dy" in st.table()
    n = len(st.records)
    step()
    assert len(st.records) == n and st.records["proj"]["matmul"]["input_activation"]["elements"] == x.numel(), \
        "nothing is recorded after the block"
