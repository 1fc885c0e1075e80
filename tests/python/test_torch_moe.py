"""mxfp8.torch MoE: BlockwiseMoE against an independent pure-torch FP64 reference of the unquantized layer written
here in the Mixtral / Hugging Face layout (per-expert w1, w3, w2), the moe op bitwise against the numpy-level calls
(mxfp8.route, blockwise_mm_fwd_mxfp8, blockwise_mm_bwd_mxfp8), the router op, route against the MoE oracle, and
bad input."""

import math

import numpy as np
import pytest
import torch

import moe_oracle
import mxfp8
import mxfp8.torch as mt
from torch_helpers import ViewRecorder, assert_view_of, cosine, fake_cuda, from_np, same_bits, to_np

T, H, I, E, K, BS = 48, 64, 40, 4, 2, 8
F8 = {torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2"}
# about 2.5 standard deviations of the projections: a few dozen of them are clamped. (Closer limits put many values
# within MXFP8's rounding error of a limit, where the quantized layer's mask legitimately differs from FP64's.)
CLAMPS = mxfp8.ClampLimits(non_linear_clamp_upper_limit=1.4, linear_clamp_lower_limit=-1.4,
                           linear_clamp_upper_limit=1.5)


def _act(name, g):
    if name == "silu":
        return g * torch.sigmoid(g)
    if name == "swish":
        return g * torch.sigmoid(1.702 * g)
    return torch.relu(g) ** 2


def fp64_moe(x, router_w, w1, w3, w2, b1g, b1u, b2, top_k, activation, clamps):
    """The unquantized layer in FP64, Mixtral style: softmax router, top-k renormalized, per expert
    (act(x w1^T + b1g) * (x w3^T + b1u)) w2^T + b2, with the gate / up projections clamped."""
    probs = torch.softmax(x @ router_w.T, dim=-1)
    top, ids = torch.topk(probs, top_k, dim=-1)
    wts = top / top.sum(-1, keepdim=True)
    c = clamps or mxfp8.ClampLimits()
    lim = lambda v, d: d if v is None else v  # noqa: E731
    out = torch.zeros_like(x)
    clamped = 0
    for e in range(w1.shape[0]):
        rows, slot = (ids == e).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        xe = x[rows]
        g0, u0 = xe @ w1[e].T + b1g[e], xe @ w3[e].T + b1u[e]
        g = torch.clamp(g0, lim(c.non_linear_clamp_lower_limit, -math.inf), lim(c.non_linear_clamp_upper_limit,
                                                                                  math.inf))
        u = torch.clamp(u0, lim(c.linear_clamp_lower_limit, -math.inf), lim(c.linear_clamp_upper_limit, math.inf))
        clamped += int((g != g0).sum() + (u != u0).sum())
        y = (_act(activation, g) * u) @ w2[e].T + b2[e]
        out = out.index_add(0, rows, wts[rows, slot, None] * y)
    return out, ids, clamped


def _hf_params(rng, bias, dead_expert=True):
    """Random Mixtral-layout parameters; expert E-1 gets a router row that no (positive) token picks."""
    def u(*shape, fan):
        return torch.from_numpy(rng.uniform(-1, 1, shape) / math.sqrt(fan))
    p = dict(router=u(E, H, fan=H) * 4, w1=u(E, I, H, fan=H), w3=u(E, I, H, fan=H), w2=u(E, H, I, fan=I))
    if dead_expert:
        p["router"][E - 1] = -1.0
    zeros = not bias
    p["b1g"] = torch.zeros(E, I, dtype=torch.float64) if zeros else u(E, I, fan=H)
    p["b1u"] = torch.zeros(E, I, dtype=torch.float64) if zeros else u(E, I, fan=H)
    p["b2"] = torch.zeros(E, H, dtype=torch.float64) if zeros else u(E, H, fan=I)
    return p


def _module(p, bias, activation, clamps, affinity, recipe="nki", dtype=torch.float32):
    m = mt.BlockwiseMoE(H, I, E, K, block_size=BS, activation=activation, bias=bias, clamp_limits=clamps,
                        affinity_option=affinity, recipe=recipe)
    m.load_mixtral_weights(p["router"], p["w1"], p["w3"], p["w2"])
    if bias:
        with torch.no_grad():
            m.gate_and_up_proj_bias[:, 0].copy_(p["b1g"])
            m.gate_and_up_proj_bias[:, 1].copy_(p["b1u"])
            m.down_proj_bias.copy_(p["b2"])
    return m.to(dtype)


def _numpy_calls(m, x, dy, dtype):
    """The numpy-level calls on the module's routing: (output, grads tuple) of mxfp8.blockwise_mm_*_mxfp8."""
    ids, w = m.route_tokens(x)
    tp, be, a = mxfp8.route(ids.numpy(), w.detach().numpy(), E, BS)
    bias = m.gate_and_up_proj_bias is not None
    cfg = mxfp8.MXFP8MOEBwdConfig(activation_type=m.activation, affinity_option=m.affinity_option,
                                  fp8_x4_dtype=F8[m.recipe.moe_dtype], scale_rule=m.recipe.scale_rule,
                                  clamp_limits=m.clamp_limits, bias=bias)
    W1, W2 = to_np(m.gate_up_proj_weight), to_np(m.down_proj_weight)
    kw = dict(gate_and_up_proj_bias=to_np(m.gate_and_up_proj_bias), down_proj_bias=to_np(m.down_proj_bias)) \
        if bias else {}
    X = to_np(x)
    y, _ = mxfp8.blockwise_mm_fwd_mxfp8(X, a, W1, W2, tp, be, BS, config=cfg, checkpoints=(), **kw)
    g = mxfp8.blockwise_mm_bwd_mxfp8(X, a, W1, W2, tp, be, to_np(dy), BS, config=cfg, grad_dtype=np.float32, **kw)
    return from_np(y), [from_np(t) for t in g]


@pytest.mark.parametrize("activation", ["silu", "swish", "squared_relu"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("clamps", [None, CLAMPS], ids=["noclamp", "clamp"])
@pytest.mark.parametrize("affinity", ["affinity_on_i", "affinity_on_h"])
def test_blockwise_moe_vs_fp64_and_numpy(rng, activation, bias, clamps, affinity):
    p = _hf_params(rng, bias)
    m = _module(p, bias, activation, clamps, affinity)
    x = torch.from_numpy(np.abs(rng.standard_normal((T, H))).astype(np.float32)).requires_grad_()
    dy = torch.from_numpy(rng.standard_normal((T, H)).astype(np.float32))
    out = m(x)
    out.backward(dy)
    # the unquantized layer in FP64
    q = {k: v.clone().requires_grad_() for k, v in p.items()}
    x64 = x.detach().double().requires_grad_()
    ref, ref_ids, clamped = fp64_moe(x64, q["router"], q["w1"], q["w3"], q["w2"], q["b1g"], q["b1u"], q["b2"], K,
                                     activation, clamps)
    assert (clamped > 10) == (clamps is not None), clamped
    ref.backward(dy.double())
    ids, _ = m.route_tokens(x.detach())
    assert torch.equal(ids.sort(-1).values, ref_ids.sort(-1).values), "routing differs from the FP64 router"
    assert not (ids == E - 1).any(), "the test needs an expert without tokens"
    gu, down = m.gate_up_proj_weight.grad, m.down_proj_weight.grad
    pairs = [(out, ref, "output"), (x.grad, x64.grad, "hidden_states"), (m.router.weight.grad, q["router"].grad,
             "router"), (gu[:, :, 0], q["w1"].grad.transpose(1, 2), "w1"), (gu[:, :, 1], q["w3"].grad.transpose(1, 2),
             "w3"), (down, q["w2"].grad.transpose(1, 2), "w2")]
    if bias:
        gb = m.gate_and_up_proj_bias.grad
        pairs += [(gb[:, 0], q["b1g"].grad, "b1 gate"), (gb[:, 1], q["b1u"].grad, "b1 up"),
                  (m.down_proj_bias.grad, q["b2"].grad, "b2")]
    for got, want, name in pairs:
        assert cosine(got, want) >= 0.99, f"{name}: cosine {cosine(got, want):.5f}"
    assert torch.all(gu[E - 1] == 0) and torch.all(down[E - 1] == 0), "an expert without tokens has zero grads"
    # bitwise equal to the numpy-level calls on the same inputs
    y_np, g_np = _numpy_calls(m, x.detach(), dy, torch.float32)
    assert same_bits(out.detach(), y_np)
    assert same_bits(gu, g_np[2]) and same_bits(down, g_np[3])
    if bias:
        assert same_bits(m.gate_and_up_proj_bias.grad, g_np[4]) and same_bits(m.down_proj_bias.grad, g_np[5])


@pytest.mark.parametrize("affinity", ["affinity_on_i", "affinity_on_h"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("recipe", ["nki", "mxfp8", "ocp"])
def test_moe_op_bitwise_vs_numpy(rng, affinity, bias, recipe, monkeypatch):
    """All gradients of the moe op (bf16 activations, f32 weights and affinities) equal the numpy calls' bits; the
    library reads the tensors in place (no copy)."""
    r = mt.get_recipe(recipe)
    ids = np.stack([rng.permutation(E - 1)[:K] for _ in range(T)])  # expert E-1 gets no tokens
    tw = rng.uniform(0.1, 1, (T, K)).astype(np.float32)
    tp, be, a = (torch.from_numpy(t) for t in mxfp8.route(ids, tw, E, BS))
    x = torch.from_numpy(rng.standard_normal((T, H)).astype(np.float32)).to(torch.bfloat16).requires_grad_()
    w1 = torch.from_numpy((rng.standard_normal((E, H, 2, I)) * 0.2).astype(np.float32)).requires_grad_()
    w2 = torch.from_numpy((rng.standard_normal((E, I, H)) * 0.2).astype(np.float32)).requires_grad_()
    b1 = torch.from_numpy(rng.standard_normal((E, 2, I)).astype(np.float32)).requires_grad_() if bias else None
    b2 = torch.from_numpy(rng.standard_normal((E, H)).astype(np.float32)).requires_grad_() if bias else None
    a = a.requires_grad_()
    rec = ViewRecorder(monkeypatch)
    out = mt.moe(x, a, w1, w2, tp.long(), be, BS, gate_and_up_proj_bias=b1, down_proj_bias=b2,
                 affinity_option=affinity, clamp_limits=CLAMPS, activation="swish", recipe=recipe)
    fwd = rec.last("mxfp8_moe_forward")[0]
    for name, t in (("hidden_states", x), ("expert_affinities_masked", a), ("gate_up_proj_weight", w1),
                    ("down_proj_weight", w2)):
        assert_view_of(getattr(fwd, name), t)
    dy = torch.from_numpy(rng.standard_normal((T, H)).astype(np.float32)).to(torch.bfloat16)
    out.backward(dy)
    cfg = mxfp8.MXFP8MOEBwdConfig(activation_type="swish", affinity_option=affinity, fp8_x4_dtype=F8[r.moe_dtype],
                                  scale_rule=r.scale_rule, clamp_limits=CLAMPS, bias=bias)
    kw = dict(gate_and_up_proj_bias=to_np(b1), down_proj_bias=to_np(b2)) if bias else {}
    args = (to_np(x), to_np(a), to_np(w1), to_np(w2), tp.numpy(), be.numpy())
    y, _ = mxfp8.blockwise_mm_fwd_mxfp8(*args, BS, config=cfg, checkpoints=(), **kw)
    g = mxfp8.blockwise_mm_bwd_mxfp8(*args, to_np(dy), BS, config=cfg, grad_dtype=np.float32, **kw)
    assert same_bits(out.detach(), from_np(y))
    assert x.grad.dtype == torch.bfloat16 and same_bits(x.grad, from_np(g[0]).to(torch.bfloat16))
    assert same_bits(a.grad, from_np(g[1]))
    assert same_bits(w1.grad, from_np(g[2])) and same_bits(w2.grad, from_np(g[3]))
    if bias:
        assert same_bits(b1.grad, from_np(g[4])) and same_bits(b2.grad, from_np(g[5]))


def test_moe_op_gate_up_checkpoint_positions_major(rng):
    """The moe op's FP32 gate/up checkpoint is a [N, 2, I, B] view of positions-major memory [N, B, 2, I] (each
    position's 2I values contiguous, so the library neither writes nor reads it transposed), holding the values of
    the numpy-level forward's contiguous checkpoint, padding positions included (zeros); the backward from it gives
    the numpy-level backward's bits."""
    ids = np.stack([rng.permutation(E - 1)[:K] for _ in range(T)])
    tw = rng.uniform(0.1, 1, (T, K)).astype(np.float32)
    tp, be, a = (torch.from_numpy(t) for t in mxfp8.route(ids, tw, E, BS))
    x = torch.from_numpy(rng.standard_normal((T, H)).astype(np.float32)).to(torch.bfloat16)
    w1 = torch.from_numpy((rng.standard_normal((E, H, 2, I)) * 0.2).astype(np.float32))
    w2 = torch.from_numpy((rng.standard_normal((E, I, H)) * 0.2).astype(np.float32))
    r = mt.get_recipe("mxfp8")
    NOCLAMP = [-math.inf, math.inf, -math.inf, math.inf]
    out, ck, _ = torch.ops.mxfp8.moe(x, a, w1, w2, tp, be, BS, None, None, "silu", NOCLAMP, [1.702, 7.0], [0, 0],
                                     "affinity_on_i", r.moe_dtype, r.scale_rule, True, True)
    N = tp.numel() // BS
    assert ck.shape == (N, 2, I, BS) and ck.dtype == torch.float32
    assert ck.stride() == (2 * I * BS, I, 1, 2 * I), ck.stride()
    cfg = mxfp8.MXFP8MOEBwdConfig(activation_type="silu", affinity_option="affinity_on_i",
                                  fp8_x4_dtype=F8[r.moe_dtype], scale_rule=r.scale_rule)
    args = (to_np(x), to_np(a), to_np(w1), to_np(w2), tp.numpy(), be.numpy())
    y, cks = mxfp8.blockwise_mm_fwd_mxfp8(*args, BS, config=cfg)
    want = from_np(cks["gate_up_proj_act_checkpoint_T"])
    assert (tp == -1).any(), "the test needs padding positions"
    assert same_bits(out, from_np(y)) and same_bits(ck.contiguous(), want)
    dy = torch.from_numpy(rng.standard_normal((T, H)).astype(np.float32)).to(torch.bfloat16)
    g = torch.ops.mxfp8.moe_backward(dy, x, a, w1, w2, tp, be, BS, None, None, ck, torch.empty(0), "silu", NOCLAMP,
                                     [1.702, 7.0], [0, 0], "affinity_on_i", r.moe_dtype, r.scale_rule, True)
    g_np = mxfp8.blockwise_mm_bwd_mxfp8(*args, to_np(dy), BS, config=cfg, grad_dtype=np.float32)
    assert same_bits(g[2], from_np(g_np[2])) and same_bits(g[3], from_np(g_np[3]))
    assert same_bits(g[1], from_np(g_np[1]))


def test_route_vs_oracle_and_grad(rng):
    ids = torch.from_numpy(np.stack([rng.permutation(E)[:K] for _ in range(T)]))
    w = torch.rand(T, K, dtype=torch.float32, requires_grad=True)
    tp, be, a = mt.route(ids, w, E, BS)
    otp, obe, oa = moe_oracle.route(ids.numpy(), w.detach().numpy(), E, BS)
    np.testing.assert_array_equal(tp.numpy(), otp)
    np.testing.assert_array_equal(be.numpy().reshape(-1), obe)
    np.testing.assert_array_equal(a.detach().numpy().reshape(-1), oa.astype(np.float32))
    R = torch.randn(T * E, 1)
    (a * R).sum().backward()
    assert torch.equal(w.grad, R.reshape(T, E).gather(1, ids))


def test_topk_softmax_vs_plain_torch(rng):
    logits = torch.from_numpy(rng.standard_normal((T, E)).astype(np.float32)).requires_grad_()
    logits.data[0] = torch.tensor([1.0, 3.0, 3.0, 3.0])  # a tie: the lower expert ids win
    w, ids = mt.topk_softmax(logits, K, renormalize=True)
    assert ids.dtype == torch.int64 and ids[0].tolist() == [1, 2]
    l64 = logits.detach().double().requires_grad_()
    p64 = torch.softmax(l64, -1)
    sel = p64.gather(1, ids)
    w64 = sel / sel.sum(-1, keepdim=True)
    assert torch.allclose(w.double(), w64, rtol=1e-6, atol=0)
    gw = torch.from_numpy(rng.standard_normal((T, K)).astype(np.float32))
    w.backward(gw)
    w64.backward(gw.double())
    assert torch.allclose(logits.grad.double(), l64.grad, rtol=1e-5, atol=1e-7)
    w2, _ = mt.topk_softmax(logits.detach(), K, renormalize=False)
    assert torch.allclose(w2.double(), p64.gather(1, ids), rtol=1e-6, atol=0)


def test_blockwise_moe_dtypes_and_shapes(rng):
    p = _hf_params(rng, bias=True, dead_expert=False)
    m = _module(p, True, "silu", None, "affinity_on_i")
    x = torch.from_numpy(rng.standard_normal((2, 3, 8, H)).astype(np.float32))
    y = m(x)
    assert y.shape == x.shape and y.dtype == torch.float32
    assert same_bits(y.reshape(-1, H), m(x.reshape(-1, H)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        yb = m(x)
    assert yb.dtype == torch.bfloat16 and cosine(yb, y) > 0.999
    mb = _module(p, True, "silu", None, "affinity_on_i", dtype=torch.bfloat16)
    xb = x.to(torch.bfloat16).requires_grad_()
    yb2 = mb(xb)
    yb2.sum().backward()
    assert yb2.dtype == torch.bfloat16 and mb.down_proj_weight.grad.dtype == torch.bfloat16
    assert cosine(yb2, y) > 0.999
    assert tuple(m(torch.empty(0, H)).shape) == (0, H)


def test_moe_bad_input(rng):
    ids = torch.from_numpy(np.stack([rng.permutation(E)[:K] for _ in range(T)]))
    w = torch.rand(T, K)
    tp, be, a = mt.route(ids, w, E, BS)
    x = torch.randn(T, H)
    w1, w2 = torch.randn(E, H, 2, I), torch.randn(E, I, H)
    with pytest.raises(ValueError, match="topk_ids: an id tensor cannot require grad"):
        mt.route(ids.float().requires_grad_(), w, E, BS)
    with pytest.raises(TypeError, match="topk_ids: dtype float32"):
        mt.route(ids.float(), w, E, BS)
    with pytest.raises(mxfp8.MXFP8Error, match="INDEX_OUT_OF_RANGE"):
        mt.route(ids + 1, w, E, BS)
    with pytest.raises(mxfp8.MXFP8Error, match="INVALID_ARGUMENT"):
        mt.route(torch.zeros(T, K, dtype=torch.int64), w, E, BS)  # a duplicate id in a row
    with pytest.raises(ValueError, match=r"topk_ids: value 42949672\d\d does not fit int32"):
        mt.route(ids + 2**32, w, E, BS)
    with pytest.raises(ValueError, match="token_position_to_id: value"):
        mt.moe(x, a, w1, w2, tp.long() + 2**33, be, BS)
    with pytest.raises(ValueError, match="hidden_states: tensor is on cuda"):
        mt.moe(fake_cuda(T, H), a, w1, w2, tp, be, BS)
    # the layer's own rules are the library's (mxfp8_moe_forward_validate), checked before the op runs
    with pytest.raises(mxfp8.MXFP8Error, match=r"SHAPE_MISMATCH.*mxfp8_moe_forward: gate_up_proj_weight has I = "
                                               rf"{I} but down_proj_weight has I = {H}"):
        mt.moe(x, a, w1, w2.transpose(1, 2), tp, be, BS)
    with pytest.raises(mxfp8.MXFP8Error, match="INVALID_ARGUMENT.*mxfp8_moe_forward: block_size 0 must be >= 1"):
        mt.moe(x, a, w1, w2, tp, be, 0)
    with pytest.raises(mxfp8.MXFP8Error, match="SHAPE_MISMATCH.*token_position_to_id has .* not a multiple of "
                                               f"block_size {BS + 1}"):
        mt.moe(x, a, w1, w2, tp, be, BS + 1)
    with pytest.raises(mxfp8.MXFP8Error, match=r"SHAPE_MISMATCH.*expert_affinities_masked has \d+ entries, "
                                               rf"expected T\*E = {T * E}"):
        mt.moe(x, a[:-1], w1, w2, tp, be, BS)
    with pytest.raises(TypeError, match="block_size: expected an int, got 4.0"):
        mt.moe(x, a, w1, w2, tp, be, 4.0)
    with pytest.raises(TypeError, match="gate_up_proj_weight: dtype int32"):
        mt.moe(x, a, w1.int(), w2, tp, be, BS)
    with pytest.raises(ValueError, match="activation: unknown value 'gelu'"):
        mt.moe(x, a, w1, w2, tp, be, BS, activation="gelu")
    with pytest.raises(ValueError, match="clamp_limits: a lower limit exceeds"):
        mt.moe(x, a, w1, w2, tp, be, BS, clamp_limits={"linear_clamp_lower_limit": 1, "linear_clamp_upper_limit": 0})
    bad = tp.clone()
    bad[3] = T  # with skip_token the padding id is -1: T is out of range
    with pytest.raises(mxfp8.MXFP8Error, match="INDEX_OUT_OF_RANGE"):
        mt.moe(x, a, w1, w2, bad, be, BS)
    with pytest.raises(ValueError, match="top_k: expected 1 <= top_k"):
        mt.BlockwiseMoE(H, I, E, E + 1)


def test_ids_to_int32_converts_once(rng, monkeypatch):
    """int64 ids cross into the library as int32 once per forward; the backward reuses them."""
    ids = torch.from_numpy(np.stack([rng.permutation(E)[:K] for _ in range(T)]))
    tp, be, a = mt.route(ids, torch.rand(T, K), E, BS)
    calls = []
    real = torch.ops.mxfp8.ids_to_int32

    class Spy:
        def __call__(self, t, name):
            calls.append(name)
            return real(t, name)
    monkeypatch.setattr(torch.ops.mxfp8, "ids_to_int32", Spy())
    x = torch.randn(T, H, requires_grad=True)
    out = mt.moe(x, a, torch.randn(E, H, 2, I) * 0.1, torch.randn(E, I, H) * 0.1, tp.long(), be.long(), BS)
    out.sum().backward()
    assert calls == ["token_position_to_id", "block_to_expert"]


def test_mixtral_mapping_and_router_grad_match_numpy_helpers(rng):
    """load_mixtral_weights lays the weights out as mxfp8.from_mixtral does; the route op's gradient of the top-k
    weights is mxfp8.topk_weights_grad of the affinity gradient."""
    p = _hf_params(rng, bias=False)
    m = _module(p, False, "silu", None, "affinity_on_i")
    gu, dn = mxfp8.from_mixtral(p["w1"].float().numpy(), p["w3"].float().numpy(), p["w2"].float().numpy())
    assert same_bits(m.gate_up_proj_weight.detach(), torch.from_numpy(gu))
    assert same_bits(m.down_proj_weight.detach(), torch.from_numpy(dn))
    ids = torch.from_numpy(np.stack([rng.permutation(E)[:K] for _ in range(T)]))
    w = torch.rand(T, K, requires_grad=True)
    _, _, a = mt.route(ids, w, E, BS)
    ga = torch.from_numpy(rng.standard_normal((T * E, 1)).astype(np.float32))
    a.backward(ga)
    assert same_bits(w.grad, torch.from_numpy(mxfp8.topk_weights_grad(ga.numpy(), ids.numpy(), E)))
