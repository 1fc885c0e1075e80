"""mxfp8.torch modules: MXFP8Linear as a drop-in nn.Linear (FP64 reference, numpy bits), convert_to_mxfp8, and
torch.compile(fullgraph=True) of a model with MXFP8Linear and BlockwiseMoE giving bitwise the eager results."""

import copy

import numpy as np
import pytest
import torch
from torch import nn

import mxfp8
import mxfp8.torch as mt
from torch_helpers import cosine, same_bits, to_np, from_np


def _t(rng, *shape, scale=1.0, dtype=torch.float32):
    return torch.from_numpy((rng.standard_normal(shape) * scale).astype(np.float32)).to(dtype)


@pytest.mark.parametrize("recipe", ["nki", "mxfp8", "ocp"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mxfp8linear_drop_in(rng, recipe, bias, dtype):
    ref = nn.Linear(96, 40, bias=bias)
    m = mt.MXFP8Linear(96, 40, bias=bias, recipe=recipe)
    m.load_state_dict(ref.state_dict())
    assert m.state_dict().keys() == ref.state_dict().keys()
    m, ref = m.to(dtype), ref.double()
    x = _t(rng, 3, 7, 96, dtype=dtype).requires_grad_()
    x64 = x.detach().double().requires_grad_()
    y, y64 = m(x), ref(x64)
    assert y.shape == (3, 7, 40) and y.dtype == dtype
    dy = _t(rng, 3, 7, 40, dtype=dtype)
    y.backward(dy)
    y64.backward(dy.double())
    pairs = [(y, y64), (x.grad, x64.grad), (m.weight.grad, ref.weight.grad)] + \
        ([(m.bias.grad, ref.bias.grad)] if bias else [])
    for got, want in pairs:
        assert cosine(got, want) >= 0.99
    r = mt.get_recipe(recipe)
    f8 = {torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2"}[r.linear_dtype]
    dx, dw = mxfp8.matmul_mxfp8_backward(to_np(dy.reshape(21, 40)), to_np(m.weight), to_np(x.detach().reshape(21, 96)),
                                         float8_dtype=f8, output_dtype=str(dtype)[6:], scale_rule=r.scale_rule)
    assert same_bits(x.grad.reshape(21, 96), from_np(dx)) and same_bits(m.weight.grad, from_np(dw))


def test_mxfp8linear_repr_and_recipe_object():
    rec = mt.MXFP8Recipe("e5m2-ocp", torch.float8_e5m2, torch.float8_e4m3fn, "ocp")
    m = mt.MXFP8Linear(64, 32, recipe=rec)
    assert "recipe='e5m2-ocp'" in repr(m) and m.recipe is rec
    with pytest.raises(ValueError, match="MXFP8Recipe.linear_dtype"):
        mt.MXFP8Recipe("x", torch.bfloat16, torch.float8_e4m3fn, "ocp")
    with pytest.raises(ValueError, match="MXFP8Recipe.scale_rule"):
        mt.MXFP8Recipe("x", torch.float8_e4m3fn, torch.float8_e4m3fn, "round")
    assert set(mt.RECIPES) == {"nki", "mxfp8", "ocp"}


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
        self.up = nn.Linear(32, 64)
        self.down = nn.Linear(64, 32, bias=False)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        x = x + self.attn(x, x, x, need_weights=False)[0]
        return self.head(x + self.down(torch.relu(self.up(x))))


def test_convert_to_mxfp8_in_place(rng):
    torch.manual_seed(0)
    model = _Block()
    before = copy.deepcopy(model)
    params = {n: p for n, p in model.named_parameters()}
    seen = []
    out = mt.convert_to_mxfp8(model, recipe="ocp", filter_fn=lambda mod, fqn: seen.append(fqn) or fqn != "head")
    assert out is model
    assert type(model.up) is mt.MXFP8Linear and type(model.down) is mt.MXFP8Linear
    assert type(model.head) is nn.Linear, "filter_fn said no"
    assert type(model.attn.out_proj) is not mt.MXFP8Linear, "an nn.Linear subclass is left alone"
    assert sorted(seen) == ["down", "head", "up"]
    assert model.up.recipe.name == "ocp" and model.down.bias is None
    assert all(p is params[n] for n, p in model.named_parameters()), "parameters are shared, not copied"
    x = _t(rng, 2, 5, 32)
    assert cosine(model(x), before(x)) > 0.99
    single = nn.Linear(8, 4)
    conv = mt.convert_to_mxfp8(single)
    assert type(conv) is mt.MXFP8Linear and conv.weight is single.weight


class _TinyModel(nn.Module):
    def __init__(self, affinity, bias):
        super().__init__()
        self.inp = mt.MXFP8Linear(48, 64, recipe="mxfp8")
        self.moe = mt.BlockwiseMoE(64, 96, 4, 2, block_size=16, bias=bias, affinity_option=affinity,
                                   clamp_limits=mxfp8.ClampLimits(linear_clamp_upper_limit=2.0))
        self.out = mt.MXFP8Linear(64, 48, bias=False, recipe="nki")

    def forward(self, x):
        h = torch.relu(self.inp(x))
        return self.out(h + self.moe(h))


@pytest.mark.parametrize("affinity,bias,autocast", [("affinity_on_i", True, False), ("affinity_on_h", False, True)])
def test_compile_fullgraph_bitwise(rng, affinity, bias, autocast):
    torch.manual_seed(1)
    model = _TinyModel(affinity, bias)
    x = _t(rng, 3, 20, 48)
    dy = _t(rng, 3, 20, 48)

    def run(m):
        m.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = m(xi)
        y.backward(dy.to(y.dtype))
        return [y.detach(), xi.grad] + [p.grad for p in model.parameters()]

    eager = run(model)
    torch._dynamo.reset()
    # bf16 graphs: inductor itself changes the rounding of torch's own bf16 ops (it fuses the router's mm with the
    # residual add into one addmm, and keeps fused bf16 intermediates in FP32); these two settings make it round as
    # eager does, so that the comparison isolates the mxfp8 ops. FP32 graphs need neither.
    with torch._inductor.config.patch(emulate_precision_casts=autocast, pattern_matcher=not autocast):
        compiled = torch.compile(model, fullgraph=True)
        got = run(compiled)
    assert len(got) == len(eager)
    for i, (a, b) in enumerate(zip(got, eager)):
        assert same_bits(a, b), f"result {i} differs between compiled and eager"


def test_bitwise_for_any_thread_count(rng):
    """Outputs and every gradient are the same bits on 1, 2 and 3 threads (torch's and the library's)."""
    torch.manual_seed(2)
    model = _TinyModel("affinity_on_i", True)
    x = _t(rng, 4, 33, 48)
    dy = _t(rng, 4, 33, 48)
    results = []
    old = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            mxfp8.set_num_threads(n)
            model.zero_grad(set_to_none=True)
            xi = x.clone().requires_grad_()
            y = model(xi)
            y.backward(dy)
            results.append([y.detach(), xi.grad] + [p.grad.clone() for p in model.parameters()])
    finally:
        torch.set_num_threads(old)
        mxfp8.set_num_threads(0)
    for other in results[1:]:
        assert all(same_bits(a, b) for a, b in zip(results[0], other))
