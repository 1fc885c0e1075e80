"""mxfp8.torch.router_linear (the batch-invariant router linear) and BlockwiseMoE(batch_invariant_router=True).

Values against a pure-Python reference written from the definition (each element one FP32 fmaf chain in ascending
order from +0, the bias added once after it; the fmaf computed exactly with fractions and rounded once to FP32) on
small sizes, and against torch in float64 with a tolerance on larger ones; the batch-invariance property (the
logits and input gradient of 1, 2 or 3 rows alone equal those of the same rows inside a batch of 2048, bitwise, at
1, 2 and 3 threads); autocast leaves it alone; bad input names the parameter; the MoE layer trains with it.
"""

from fractions import Fraction

import numpy as np
import pytest
import torch

import mxfp8
import mxfp8.torch as mt
from torch_helpers import fake_cuda, same_bits


def _t(rng, *shape, dtype=torch.float32, scale=1.0):
    return torch.from_numpy((rng.standard_normal(shape) * scale).astype(np.float32)).to(dtype)


# ---- the reference: fmaf computed exactly, rounded once (RNE) to FP32 ----
def _fmaf(a, b, c):
    q = Fraction(a) * Fraction(b) + Fraction(c)
    d = float(q)  # correctly rounded to FP64; rounding that to FP32 is right unless d is an FP32 midpoint
    f = np.float32(d)
    if Fraction(d) != q and Fraction(float(f)) != Fraction(d):
        toward = np.float32(np.inf) if Fraction(d) > Fraction(float(f)) else np.float32(-np.inf)
        g = np.nextafter(f, toward)
        if (Fraction(float(f)) + Fraction(float(g))) / 2 == Fraction(d):  # a midpoint: q lies on one side
            f = f if (q - Fraction(d)) * (Fraction(float(f)) - Fraction(d)) > 0 else g
    return float(f)


def _chain(a, b):
    acc = 0.0
    for x, y in zip(a, b):
        acc = _fmaf(x, y, acc)
    return acc


def _ref(x, w, b, dl):
    """(logits, dx, dw) of the definition, in FP32 (x, w, b, dl: float32 values as lists of lists)."""
    T, H, E = len(x), len(w[0]), len(w)
    lg = [[_chain(x[t], w[e]) for e in range(E)] for t in range(T)]
    if b is not None:
        lg = [[float(np.float32(lg[t][e]) + np.float32(b[e])) for e in range(E)] for t in range(T)]
    dx = [[_chain(dl[t], [w[e][h] for e in range(E)]) for h in range(H)] for t in range(T)]
    dw = [[_chain([dl[t][e] for t in range(T)], [x[t][h] for t in range(T)]) for h in range(H)] for e in range(E)]
    return (torch.tensor(lg, dtype=torch.float32), torch.tensor(dx, dtype=torch.float32),
            torch.tensor(dw, dtype=torch.float32))


def test_fmaf_reference_rounds_once():
    # 1 + 2^-24 (an FP32 midpoint) + 2^-60: FP64 then FP32 rounding would give 1.0; the single rounding goes up
    a, c = 1.0 + 2.0 ** -24, 2.0 ** -60
    assert _fmaf(a, 1.0, c) == 1.0 + 2.0 ** -23
    assert _fmaf(1.0 + 2.0 ** -23, 1.0 + 2.0 ** -23, 0.0) == float(np.float32(1.0 + 2.0 ** -22))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_exact_chain(rng, dtype, bias):
    T, H, E = 5, 41, 6
    x = _t(rng, H, T, dtype=dtype).t()  # a transposed (strided) input
    w = _t(rng, E, H, scale=0.3)
    b = _t(rng, E) if bias else None
    dl = _t(rng, T, E)
    xg, wg = x.detach().clone().requires_grad_(), w.clone().requires_grad_()
    bg = b.clone().requires_grad_() if bias else None
    y = mt.router_linear(xg, wg, bg)
    y.backward(dl)
    lg, dx, dw = _ref(x.float().tolist(), w.tolist(), None if b is None else b.tolist(), dl.tolist())
    assert y.dtype == torch.float32 and same_bits(y, lg)
    assert xg.grad.dtype == dtype and same_bits(xg.grad, dx.to(dtype))  # rounded once from the FP32 chain
    assert same_bits(wg.grad, dw)
    if bias:
        assert same_bits(bg.grad, torch.from_numpy(mxfp8.bias_grad(dl.numpy())))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_values_against_float64(rng, dtype):
    T, H, E = 300, 700, 24
    x = _t(rng, 4, T // 4, H, dtype=dtype).requires_grad_()
    w = _t(rng, E, H, scale=0.05, dtype=dtype).requires_grad_()
    b = _t(rng, E, dtype=dtype).requires_grad_()
    y = mt.router_linear(x, w, b)
    assert y.shape == (4, T // 4, E) and y.dtype == torch.float32
    g = _t(rng, 4, T // 4, E)
    y.backward(g)
    x64, w64, b64 = (t.detach().double() for t in (x, w, b))
    want = x64 @ w64.T + b64
    mag = x64.abs() @ w64.abs().T + b64.abs()
    assert ((y.double() - want).abs() <= mag * H * 2.0 ** -24).all()
    assert x.grad.dtype == dtype and w.grad.dtype == dtype and b.grad.dtype == dtype
    tol = {torch.float32: 1e-5, torch.bfloat16: 2 ** -8, torch.float16: 2 ** -10}[dtype]
    for got, ref in ((x.grad, g.double() @ w64), (w.grad, g.reshape(T, E).double().T @ x64.reshape(T, H)),
                     (b.grad, g.double().sum((0, 1)))):
        assert torch.allclose(got.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_alone_equal_rows_in_a_batch(rng, dtype):
    """The property the router needs: a row's logits and input gradient do not depend on the batch or threads."""
    T, H, E = 2048, 1024, 8
    x = _t(rng, T, H, dtype=dtype)
    w = _t(rng, E, H, scale=0.03)
    b = _t(rng, E)
    g = _t(rng, T, E)

    def run(rows):
        xr = x[rows].clone().requires_grad_()
        y = mt.router_linear(xr, w, b)
        (gx,) = torch.autograd.grad(y, xr, g[rows])
        return y, gx

    try:
        full = None
        for nt in (1, 2, 3):
            mxfp8.set_num_threads(nt)
            y, gx = run(slice(0, T))
            if full is None:
                full = (y, gx)
            assert same_bits(y, full[0]) and same_bits(gx, full[1]), f"{nt} threads"
            for start in (0, 1, 999, T - 3):
                for n in (1, 2, 3):
                    rows = slice(start, start + n)
                    ya, gxa = run(rows)
                    assert same_bits(ya, full[0][rows]), f"logits of rows {start}..+{n} alone, {nt} threads"
                    assert same_bits(gxa, full[1][rows]), f"input gradient of rows {start}..+{n}, {nt} threads"
    finally:
        mxfp8.set_num_threads(0)


def test_weight_gradient_same_for_any_thread_count(rng):
    x = _t(rng, 1500, 300).requires_grad_()
    w = _t(rng, 16, 300).requires_grad_()
    grads = []
    try:
        for nt in (1, 2, 3):
            mxfp8.set_num_threads(nt)
            x.grad = w.grad = None
            mt.router_linear(x, w).square().sum().backward()
            grads.append((x.grad.clone(), w.grad.clone()))
    finally:
        mxfp8.set_num_threads(0)
    assert all(same_bits(a[0], grads[0][0]) and same_bits(a[1], grads[0][1]) for a in grads)


def test_autocast_does_not_touch_it(rng):
    x, w, b = _t(rng, 7, 64), _t(rng, 5, 64), _t(rng, 5)
    plain = mt.router_linear(x, w, b)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = mt.router_linear(x, w, b)
    assert y.dtype == torch.float32 and same_bits(y, plain)


def test_needs_only_the_gradients_asked_for(rng):
    x, w = _t(rng, 6, 32), _t(rng, 4, 32).requires_grad_()
    mt.router_linear(x, w).sum().backward()  # x needs no gradient
    assert w.grad is not None and x.grad is None
    gi, gw, gb = torch.ops.mxfp8.router_linear_backward(torch.ones(6, 4), x, w.detach(), None, [False, True])
    assert gi.numel() == 0 and gb.numel() == 0 and same_bits(gw, w.grad)


def test_bad_input(rng):
    x, w = _t(rng, 4, 16), _t(rng, 3, 16)
    with pytest.raises(ValueError, match="input: last dimension must be the hidden size H = 16"):
        mt.router_linear(_t(rng, 4, 15), w)
    with pytest.raises(ValueError, match="weight: expected a 2-D tensor"):
        mt.router_linear(x, w[0])
    with pytest.raises(ValueError, match=r"bias: expected shape \(3,\)"):
        mt.router_linear(x, w, torch.zeros(4))
    with pytest.raises(TypeError, match="input: dtype int32"):
        mt.router_linear(x.int(), w)
    with pytest.raises(TypeError, match="weight: dtype float64"):
        mt.router_linear(x, w.double())
    with pytest.raises(ValueError, match="input: tensor is on cuda"):
        mt.router_linear(fake_cuda(4, 16), w)


def _moe(**kw):
    torch.manual_seed(3)
    return mt.BlockwiseMoE(64, 32, 8, 2, block_size=16, **kw)


def test_blockwise_moe_batch_invariant_router_trains(rng):
    m = _moe(router_bias=True, batch_invariant_router=True, output_router_logits=True)
    assert m.state_dict().keys() == _moe(router_bias=True).state_dict().keys()
    assert "batch_invariant_router=True" in repr(m)
    x = _t(rng, 40, 64).requires_grad_()
    out, logits = m(x)
    assert logits.dtype == torch.float32
    assert same_bits(logits, mt.router_linear(x, m.router.weight, m.router.bias))
    loss = out.square().mean() + mt.load_balancing_loss(logits, 8, 2)
    loss.backward()
    for p in (m.router.weight, m.router.bias, m.gate_up_proj_weight, m.down_proj_weight):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
    assert x.grad is not None and torch.isfinite(x.grad).all()
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    before = m.router.weight.detach().clone()
    losses = []
    for _ in range(5):
        opt.zero_grad()
        out, logits = m(x.detach())
        loss = out.square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert not torch.equal(before, m.router.weight) and losses[-1] < losses[0]


def test_blockwise_moe_routing_independent_of_the_batch(rng):
    m = _moe(batch_invariant_router=True)
    x = _t(rng, 256, 64)
    ids, w = m.route_tokens(x)
    for rows in (slice(0, 1), slice(100, 102), slice(253, 256)):
        ids_a, w_a = m.route_tokens(x[rows])
        assert torch.equal(ids_a, ids[rows]) and same_bits(w_a, w[rows])
    # the same parameters without the option: logits of the router's nn.Linear, in x's dtype
    plain = _moe()
    plain.load_state_dict(m.state_dict())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert plain._router_logits(x.bfloat16()).dtype == torch.bfloat16
        assert m._router_logits(x.bfloat16()).dtype == torch.float32


def test_blockwise_moe_compiles_to_the_eager_bits(rng):
    m = _moe(router_bias=True, batch_invariant_router=True)
    x, dy = _t(rng, 2, 24, 64), _t(rng, 2, 24, 64)

    def run(mod):
        m.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_()
        y = mod(xi)
        y.backward(dy)
        return [y.detach(), xi.grad] + [p.grad for p in m.parameters()]

    eager = run(m)
    torch._dynamo.reset()
    got = run(torch.compile(m, fullgraph=True))
    assert len(got) == len(eager)
    for i, (a, b) in enumerate(zip(got, eager)):
        assert same_bits(a, b), f"result {i} differs between compiled and eager"
