"""mxfp8.torch ops: quantize / dequantize against the independent MX oracle, linear against a pure-torch FP64
reference and bitwise against the numpy-level calls, zero copy (the library receives the tensors' own memory),
out= in place, bad input, and torch.library.opcheck of every op."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import matmul_oracle
import mx_oracle
import mxfp8
import mxfp8.torch as mt
from torch_helpers import ViewRecorder, assert_view_of, cosine, fake_cuda, from_np, same_bits, to_np

FLOATS = [torch.float32, torch.bfloat16, torch.float16]
ELEMS = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}
RECIPES = ["nki", "mxfp8", "ocp"]
F8_NAME = {torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2"}


def randn(rng, *shape, dtype=torch.float32, spread=0):
    a = rng.standard_normal(shape)
    if spread:
        a = a * np.exp2(rng.integers(-spread, spread + 1, shape[:-1] + (1,)))
    return torch.from_numpy(a.astype(np.float32)).to(dtype)


def test_import_mxfp8_does_not_import_torch():
    code = ("import sys, mxfp8; mxfp8.quantize([1.0] * 32); assert 'torch' not in sys.modules, 'torch imported'; "
            "import mxfp8.torch; assert 'torch' in sys.modules; print('ok')")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(mxfp8.__file__))))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


# ---- quantize / dequantize ----
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("elem", list(ELEMS))
@pytest.mark.parametrize("rule", ["nki", "ocp", "rceil"])
def test_quantize_dequantize_match_oracle(rng, dtype, elem, rule):
    x = randn(rng, 24, 100, dtype=dtype, spread=10)
    x[3, 40:72] = 0
    x[5, 7] = float("nan")
    data, scales = mt.quantize(x, elem, axis=-1, scale_rule=rule)
    assert data.dtype == elem and scales.dtype == torch.float8_e8m0fnu and tuple(scales.shape) == (24, 4)
    codes, sc = mx_oracle.quantize(to_np(x), ELEMS[elem], axis=-1, rule=rule)
    np.testing.assert_array_equal(to_np(data).view(np.uint8), codes)
    np.testing.assert_array_equal(to_np(scales), sc)
    for out_dtype in FLOATS:
        got = mt.dequantize(data, scales, axis=-1, output_dtype=out_dtype)
        want = mx_oracle.dequantize(codes, sc, ELEMS[elem], axis=-1, out_dtype=to_np(torch.empty(0, dtype=out_dtype))
                                    .dtype)
        assert got.dtype == out_dtype
        assert same_bits(got, from_np(want)), out_dtype


def test_quantize_strided_in_place(rng, monkeypatch):
    """A transposed, sliced input is read where it lies; out= tensors are written where they lie."""
    base = randn(rng, 70, 3, 64)
    x = base[:, 1, :].t()  # [64, 70], strides (1, 192)
    rec = ViewRecorder(monkeypatch)
    data = torch.empty(70, 64, dtype=torch.float8_e4m3fn).t()   # [64, 70] non-contiguous output
    scales = torch.empty(64, 3, dtype=torch.uint8)
    r = mt.quantize(x, torch.float8_e4m3fn, axis=1, out=(data, scales))
    assert r[0] is data and r[1] is scales
    vx, _, _, vd, vs = rec.last("mxfp8_quantize")
    assert_view_of(vx, x)
    assert_view_of(vd, data)
    assert_view_of(vs, scales)
    codes, sc = mx_oracle.quantize(to_np(x), "e4m3", axis=1, rule="nki")
    np.testing.assert_array_equal(to_np(data).view(np.uint8), codes)
    np.testing.assert_array_equal(scales.numpy(), sc)
    out = torch.empty(64, 70)
    assert mt.dequantize(data, scales, axis=1, out=out) is out
    assert_view_of(rec.last("mxfp8_dequantize")[4], out)
    np.testing.assert_array_equal(out.numpy(), mx_oracle.dequantize(codes, sc, "e4m3", axis=1))


def test_quantize_3d_axis(rng):
    x = randn(rng, 3, 50, 7, dtype=torch.bfloat16)
    data, scales = mt.quantize(x, torch.float8_e5m2, axis=1, scale_rule="ocp")
    codes, sc = mx_oracle.quantize(to_np(x), "e5m2", axis=1, rule="ocp")
    np.testing.assert_array_equal(to_np(data).view(np.uint8), codes)
    np.testing.assert_array_equal(to_np(scales), sc)


# ---- linear ----
def _np_linear(x, w, b, recipe):
    """The numpy-level calls on the same inputs: mxfp8.matmul_mxfp8 (+ bias in FP32, one rounding)."""
    r = mt.get_recipe(recipe)
    x2 = x.reshape(-1, x.shape[-1])
    if b is None:
        y = mxfp8.matmul_mxfp8(to_np(x2), to_np(w), float8_dtype=F8_NAME[r.linear_dtype],
                               output_dtype=str(x.dtype).replace("torch.", ""), scale_rule=r.scale_rule)
        return from_np(y).reshape(*x.shape[:-1], w.shape[0])
    y = mxfp8.matmul_mxfp8(to_np(x2), to_np(w), float8_dtype=F8_NAME[r.linear_dtype], output_dtype="float32",
                           scale_rule=r.scale_rule)
    return (from_np(y) + b.float()).to(x.dtype).reshape(*x.shape[:-1], w.shape[0])


def _np_linear_backward(dy, x, w, recipe):
    r = mt.get_recipe(recipe)
    dy2, x2 = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])
    same = x.dtype == w.dtype
    out = str(x.dtype).replace("torch.", "") if same else "float32"
    dx, dw = mxfp8.matmul_mxfp8_backward(to_np(dy2), to_np(w), to_np(x2), float8_dtype=F8_NAME[r.linear_dtype],
                                         output_dtype=out, scale_rule=r.scale_rule)
    return from_np(dx).to(x.dtype).reshape(x.shape), from_np(dw).to(w.dtype)


def _fp64_linear(x, w, b, dy):
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    b64 = None if b is None else b.detach().double().requires_grad_()
    y = torch.nn.functional.linear(x64, w64, b64)
    y.backward(dy.double())
    return y, x64.grad, w64.grad, None if b is None else b64.grad


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("dtypes", [(torch.float32,) * 3, (torch.bfloat16,) * 3, (torch.float16,) * 3,
                                    (torch.bfloat16, torch.float32, torch.float32)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_vs_fp64_and_numpy(rng, recipe, dtypes, bias):
    """Forward and gradients: cosine >= 0.99 to the unquantized FP64 layer, bitwise equal to the numpy calls."""
    xd, wd, bd = dtypes
    x = randn(rng, 2, 33, 96, dtype=xd).requires_grad_()
    w = (randn(rng, 80, 96, dtype=torch.float32) * 0.1).to(wd).requires_grad_()
    b = randn(rng, 80, dtype=bd).requires_grad_() if bias else None
    y = mt.linear(x, w, b, recipe=recipe)
    assert y.dtype == xd and tuple(y.shape) == (2, 33, 80)
    dy = randn(rng, 2, 33, 80, dtype=xd)
    y.backward(dy)
    y64, dx64, dw64, db64 = _fp64_linear(x, w, b, dy)
    for got, ref, name in ((y, y64, "y"), (x.grad, dx64, "dx"), (w.grad, dw64, "dw")) + \
            (((b.grad, db64, "db"),) if bias else ()):
        assert cosine(got, ref) >= 0.99, name
    assert same_bits(y.detach(), _np_linear(x.detach(), w.detach(), None if b is None else b.detach(), recipe))
    dx, dw = _np_linear_backward(dy, x.detach(), w.detach(), recipe)
    assert x.grad.dtype == xd and w.grad.dtype == wd
    assert same_bits(x.grad, dx) and same_bits(w.grad, dw)
    if bias:
        db = torch.from_numpy(matmul_oracle.bias_grad(to_np(dy).astype(np.float32).reshape(-1, 80))).to(bd)
        assert b.grad.dtype == bd and same_bits(b.grad, db)


def test_linear_zero_copy_and_out(rng, monkeypatch):
    """Non-contiguous input and weight go in as they are; out= and grad buffers are written in place."""
    big = randn(rng, 40, 100, dtype=torch.bfloat16)
    x = big[:, 3:67]                       # [40, 64], row stride 100
    w = randn(rng, 64, 48, dtype=torch.bfloat16).t()  # [48, 64], strides (1, 48)
    rec = ViewRecorder(monkeypatch)
    out = torch.empty(48, 40, dtype=torch.bfloat16).t()  # [40, 48] non-contiguous
    assert mt.linear(x, w, out=out, recipe="nki") is out
    va, vb = rec.last("mxfp8_linear")[0].values, rec.last("mxfp8_linear")[1].values
    assert_view_of(va, x)
    assert_view_of(vb, w)
    assert_view_of(rec.last("mxfp8_linear")[4], out)
    assert same_bits(out.contiguous(), _np_linear(x, w, None, "nki"))
    dy = randn(rng, 40, 48, dtype=torch.bfloat16)
    gi, gw = torch.empty_like(x), torch.empty_like(w)
    ri, rw = mt.linear_backward(dy, x, w, "nki", grad_input=gi, grad_weight=gw)
    assert ri is gi and rw is gw
    args, vdx, vdw = rec.last("mxfp8_matmul_backward")
    assert_view_of(args.input_activation, x)
    assert_view_of(args.weights, w)
    assert_view_of(vdx, gi)
    assert_view_of(vdw, gw)
    dx, dw = _np_linear_backward(dy, x, w, "nki")
    assert same_bits(gi, dx) and same_bits(gw, dw)


def test_linear_nd_input_flattens_without_copy(rng, monkeypatch):
    base = randn(rng, 2, 3, 3, 48)
    x = base[..., 5:45]                 # [2, 3, 3, 40], row stride 48: the leading dims collapse to [18, 40]
    w = randn(rng, 24, 40)
    rec = ViewRecorder(monkeypatch)
    y = mt.linear(x, w)
    v = rec.last("mxfp8_linear")[0].values
    assert v.data == x.data_ptr() and (v.shape[0], v.strides[0]) == (18, 48)
    assert same_bits(y.reshape(18, 24), mt.linear(x.reshape(18, 40).contiguous(), w))
    xt = base.transpose(0, 2)[..., :40]  # [3, 3, 2, 40]: needs a copy to flatten, same result
    assert same_bits(mt.linear(xt, w).reshape(18, 24), mt.linear(xt.reshape(18, 40).contiguous(), w))


def test_linear_empty_and_autocast(rng):
    w = randn(rng, 16, 32)
    assert tuple(mt.linear(torch.empty(0, 32), w).shape) == (0, 16)
    assert torch.equal(mt.linear(randn(rng, 3, 0), torch.empty(4, 0)), torch.zeros(3, 4))  # K = 0: zeros
    assert tuple(mt.linear(randn(rng, 2, 3, 5), torch.empty(0, 5)).shape) == (2, 3, 0)
    x = randn(rng, 4, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = mt.linear(x, w)
    assert y.dtype == torch.bfloat16
    assert same_bits(y, mt.linear(x.to(torch.bfloat16), w))


# ---- bad input: clear errors, nothing written ----
def test_linear_bad_input(rng):
    x, w = randn(rng, 4, 32), randn(rng, 16, 32)
    with pytest.raises(ValueError, match="input: tensor is on cuda"):
        mt.linear(fake_cuda(4, 32), w)
    with pytest.raises(ValueError, match="weight: tensor is on cuda"):
        mt.linear(x, fake_cuda(16, 32))
    with pytest.raises(TypeError, match="input: dtype int32 is not accepted"):
        mt.linear(torch.zeros(4, 32, dtype=torch.int32), w)
    with pytest.raises(TypeError, match="weight: dtype float64"):
        mt.linear(x, w.double())
    with pytest.raises(ValueError, match="input: last dimension must be in_features = 32"):
        mt.linear(randn(rng, 4, 31), w)
    with pytest.raises(ValueError, match="weight: expected a 2-D tensor"):
        mt.linear(x, w.reshape(16, 2, 16))
    with pytest.raises(ValueError, match=r"bias: expected shape \(16,\)"):
        mt.linear(x, w, torch.zeros(15))
    with pytest.raises(ValueError, match="recipe: unknown recipe 'fp8'"):
        mt.linear(x, w, recipe="fp8")
    out = torch.full((4, 15), 7.0)
    with pytest.raises(ValueError, match=r"out: expected shape \(4, 16\)"):
        mt.linear(x, w, out=out)
    with pytest.raises(TypeError, match="out: dtype int32"):
        mt.linear(x, w, out=torch.zeros(4, 16, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="out= does not support automatic differentiation"):
        mt.linear(x.clone().requires_grad_(), w, out=torch.empty(4, 16))
    overlap = torch.full((4, 48), 7.0)
    with pytest.raises(mxfp8.MXFP8Error, match="ALIASING|overlap"):
        mt.linear(overlap[:, :32], w, out=overlap[:, 32:])
    assert torch.all(overlap[:, 32:] == 7.0)


def test_quantize_bad_input_writes_nothing(rng):
    x = randn(rng, 4, 100)
    data = torch.full((4, 100), 3, dtype=torch.uint8).view(torch.float8_e4m3fn)
    scales = torch.full((4, 4), 9, dtype=torch.uint8)
    with pytest.raises(mxfp8.MXFP8Error, match="UNSUPPORTED"):
        mt.quantize(x, group="wrapx", out=(data, scales))
    assert torch.all(data.view(torch.uint8) == 3) and torch.all(scales == 9)
    with pytest.raises(TypeError, match="x: dtype int64"):
        mt.quantize(torch.zeros(4, 32, dtype=torch.int64))
    with pytest.raises(ValueError, match="elem_dtype"):
        mt.quantize(x, torch.bfloat16)
    with pytest.raises(ValueError, match="axis: 2 is out of range"):
        mt.quantize(x, axis=2)
    with pytest.raises(ValueError, match="scale_rule: unknown value 'floor'"):
        mt.quantize(x, scale_rule="floor")
    with pytest.raises(ValueError, match="x: tensor is on cuda"):
        mt.quantize(fake_cuda(4, 32))
    with pytest.raises(TypeError, match="data: dtype float32"):
        mt.dequantize(x, scales)


# ---- opcheck: schema, autograd registration, fake tensors, AOT dispatch with dynamic shapes ----
def _moe_args(rng, affinity="affinity_on_i", bias=False, activation="silu", swiglu=(1.702, 7.0), rounding=(0, 0)):
    T, H, I, E, K, Bs = 12, 64, 40, 4, 2, 8
    ids = torch.from_numpy(np.stack([rng.permutation(E)[:K] for _ in range(T)]))
    w = torch.rand(T, K, dtype=torch.float32)
    tp, be, a = mt.route(ids, w, E, Bs)
    x = randn(rng, T, H, dtype=torch.bfloat16).requires_grad_()
    w1 = (randn(rng, E, H, 2, I) * 0.1).requires_grad_()
    w2 = (randn(rng, E, I, H) * 0.1).requires_grad_()
    b1 = randn(rng, E, 2, I).requires_grad_() if bias else None
    b2 = randn(rng, E, H).requires_grad_() if bias else None
    lims = [-math.inf, 3.0, -2.5, math.inf]
    return (x, a.requires_grad_(), w1, w2, tp, be, Bs, b1, b2, activation, lims, list(swiglu), list(rounding),
            affinity, torch.float8_e4m3fn, "nki", True, True)


def _opcheck_cases(rng):
    x = randn(rng, 8, 64, dtype=torch.bfloat16)
    w = randn(rng, 16, 64)
    b = randn(rng, 16)
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
    data, scales = mt.quantize(x)
    dy = randn(rng, 8, 16, dtype=torch.bfloat16)
    logits = randn(rng, 10, 6).requires_grad_()
    ids = torch.from_numpy(np.stack([rng.permutation(6)[:2] for _ in range(10)]))
    moe_in = _moe_args(rng, "affinity_on_h", bias=True)
    out, ck_gu, ck_down = torch.ops.mxfp8.moe(*moe_in)
    g_out = randn(rng, *out.shape, dtype=out.dtype)
    plain = tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in moe_in)
    ops = torch.ops.mxfp8
    return [
        (ops.quantize, (x, 1, torch.float8_e4m3fn, "rceil", "1x32")),
        (ops.quantize_out, (x, 1, torch.float8_e5m2, "nki", "1x32", torch.empty(8, 64, dtype=torch.float8_e5m2),
                            torch.empty(8, 2, dtype=torch.float8_e8m0fnu))),
        (ops.dequantize, (data, scales, 1, "1x32", torch.bfloat16)),
        (ops.dequantize_out, (data, scales, 1, "1x32", torch.empty(8, 64))),
        (ops.linear, (xg, wg, bg, torch.float8_e4m3fn, "rceil")),
        (ops.linear, (xg, wg, None, torch.float8_e5m2, "nki")),
        (ops.linear_out, (x, w, b, torch.float8_e4m3fn, "ocp", torch.empty(8, 16, dtype=torch.bfloat16))),
        (ops.linear_backward, (dy, x, w, torch.float8_e4m3fn, "rceil", torch.float32)),
        (ops.linear_backward_out, (dy, x, w, torch.float8_e4m3fn, "rceil", torch.empty_like(x),
                                   torch.empty_like(w))),
        (ops.router_linear, (xg, wg, bg)),
        (ops.router_linear, (randn(rng, 2, 3, 64).requires_grad_(), wg, None)),
        (ops.router_linear_backward, (randn(rng, 8, 16), x, w, torch.bfloat16, [True, True])),
        (ops.router_linear_backward, (randn(rng, 8, 16), x, w, None, [False, True])),
        (ops.topk_softmax, (logits, 2, True)),
        (ops.topk_softmax_backward, (torch.rand(10, 2), logits.detach(), ids, True)),
        (ops.route, (ids, torch.rand(10, 2, requires_grad=True), 6, 4, True)),
        (ops.ids_to_int32, (ids, "topk_ids")),
        (ops.moe, moe_in),
        (ops.moe, _moe_args(rng)),
        (ops.moe, _moe_args(rng)[:-1] + (False,)),
        (ops.moe, _moe_args(rng, activation="gpt_oss_swiglu", swiglu=(1.5, 2.0), rounding=(0b111111111111, -3))),
        (ops.moe_backward, (g_out,) + plain[:9] + (ck_gu.detach(), ck_down.detach()) + plain[9:-1]),
        (ops.moe_backward, (g_out,) + plain[:9] + (torch.empty(0), torch.empty(0)) + plain[9:-1]),
    ]


def _float8_args(args):
    return [a for a in args if isinstance(a, torch.Tensor) and a.dtype in (torch.float8_e4m3fn, torch.float8_e5m2,
                                                                             torch.float8_e8m0fnu)]


def test_opcheck_every_op(rng):
    cases = _opcheck_cases(rng)
    names = {op.__name__ for op, _ in cases}
    registered = {n for n in dir(torch.ops.mxfp8) if not n.startswith("_") and n not in ("name", "overloads")}
    assert registered <= names, f"ops without an opcheck case: {sorted(registered - names)}"
    for op, args in cases:
        utils = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
        if _float8_args(args):
            # opcheck's test_schema compares tensors with torch.allclose, which has no float8 kernel: check the
            # schema's mutation contract directly instead (inputs not marked mutable keep their bits)
            utils = utils[1:]
            mutable = {a.name for a in op.default._schema.arguments if a.alias_info and a.alias_info.is_write}
            names_ = [a.name for a in op.default._schema.arguments]
            before = {n: a.clone() for n, a in zip(names_, args) if isinstance(a, torch.Tensor)}
            op(*args)
            for n, a in zip(names_, args):
                if isinstance(a, torch.Tensor) and n not in mutable:
                    assert same_bits(a, before[n]), f"{op}: input {n} was modified"
        result = torch.library.opcheck(op, args, test_utils=utils)
        assert all(v == "SUCCESS" for v in result.values()), (op, result)


def test_docstrings_name_every_parameter_and_carry_no_jargon():
    """help(mxfp8.torch.<name>) documents every parameter; no docstring of mxfp8.torch carries internal shorthand."""
    import inspect

    from test_docs import JARGON
    from mxfp8.torch import _bridge, modules, moe_ops, ops, recipes
    for name in mt.__all__:
        obj = getattr(mt, name)
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        doc = inspect.getdoc(obj) or ""
        target = obj.__init__ if inspect.isclass(obj) and "__init__" in vars(obj) else obj
        params = [p for p in inspect.signature(target).parameters if p not in ("self", "device", "dtype")]
        if inspect.isclass(obj) and hasattr(obj, "__dataclass_fields__"):
            params = list(obj.__dataclass_fields__)
        missing = [p for p in params if p not in doc]
        assert len(doc) > 80 and not missing, f"mxfp8.torch.{name}: the docstring does not mention {missing}"
    bad = []
    for mod in (mt, _bridge, modules, moe_ops, ops, recipes):
        texts = [mod.__doc__ or ""] + [getattr(o, "__doc__", "") or "" for o in vars(mod).values()
                                       if (inspect.isfunction(o) or inspect.isclass(o)) and
                                       getattr(o, "__module__", "") == mod.__name__]
        for t in texts:
            bad += [f"{mod.__name__}: {t[max(0, m.start() - 30):m.end() + 30]!r}" for m in JARGON.finditer(t)]
    assert not bad, "\n".join(bad)
