"""matmul_mxfp8 forward/backward against the independent FP64 oracle (matmul_oracle.py), the NKI criteria, and the
invariances the API promises (knobs, threads, pre-quantized operands, NaN propagation, full output writes)."""

import ml_dtypes
import numpy as np
import pytest

import matmul_oracle as O
import mxfp8
from mxfp8 import matmul as mm

BF16 = ml_dtypes.bfloat16
FMTS = ["float8_e4m3fn", "float8_e5m2"]
RULES = ["nki", "ocp", "rceil"]
SMALL = [(1, 1, 1), (33, 65, 97), (96, 160, 224), (127, 129, 131)]  # (M, K, N)
UPSTREAM = [(512, 512, 512), (1024, 1024, 1024), (2048, 1024, 512), (512, 1024, 2048)]


def _inputs(rng, M, K, N, dtype=BF16, spread=0):
    """dY [M, N], W [N, K], X [M, K]; rows scaled by 2^U(-spread, spread) to exercise the scale range."""
    def mk(r, c):
        a = rng.standard_normal((r, c))
        if spread:
            a = a * np.exp2(rng.integers(-spread, spread + 1, (r, 1))) * np.exp2(rng.integers(-spread, spread + 1, (1, c)))
        return a.astype(np.float32).astype(dtype)
    return mk(M, N), mk(N, K), mk(M, K)


def _check_bound(got, exact, S, K, out_dtype, what):
    got = np.asarray(got).astype(np.float64)
    assert got.shape == exact.shape, what
    assert np.all(np.isfinite(got)), f"{what}: non-finite output"
    b = O.bound(exact, S, K, out_dtype)
    viol = np.abs(got - exact) > b
    if viol.any():
        i = np.unravel_index(np.argmax(np.abs(got - exact) / b), got.shape)
        pytest.fail(f"{what}: {int(viol.sum())} elements outside the FP32-accumulation bound; worst at {i}: "
                    f"got {got[i]!r}, exact {exact[i]!r}, bound {b[i]!r}")


def _run_and_check(rng, M, K, N, fmt, rule, group, out_dtype, spread=0, dtype=BF16):
    dy, w, x = _inputs(rng, M, K, N, dtype, spread)
    dx, dw = mxfp8.matmul_mxfp8_backward(dy, w, x, float8_dtype=fmt, output_dtype=out_dtype, scale_rule=rule,
                                         quant_scheme=group)
    assert dx.shape == (M, K) and dw.shape == (N, K)
    (ex, sx, kx), (ew, sw, kw) = O.backward(dy, w, x, O.fmt_name(fmt), rule, group)
    tag = f"M,K,N={M},{K},{N} {fmt} {rule} {group} {out_dtype}"
    _check_bound(dx, ex, sx, kx, out_dtype, "input_grad " + tag)
    _check_bound(dw, ew, sw, kw, out_dtype, "weight_grad " + tag)


@pytest.mark.parametrize("shape", SMALL)
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("rule", RULES)
def test_backward_small_vs_oracle(rng, shape, fmt, rule):
    M, K, N = shape
    _run_and_check(rng, M, K, N, fmt, rule, "1x32", "float32", spread=12)
    _run_and_check(rng, M, K, N, fmt, rule, "1x32", "bfloat16")
    _run_and_check(rng, M, K, N, fmt, rule, "1x32", "float16", dtype=np.float16)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("rule", RULES)
def test_backward_wrapx_vs_oracle(rng, fmt, rule):
    # wrapX needs both contraction lengths (N for dX, M for dW) % 128 == 0; 384 = one 256 + one 128 subtile,
    # 640 = one 512 tile + one 128 subtile.
    _run_and_check(rng, 128, 33, 384, fmt, rule, "wrapx", "float32", spread=8)
    _run_and_check(rng, 640, 40, 128, fmt, rule, "wrapx", "float32", spread=8)


@pytest.mark.parametrize("fmt", FMTS)
def test_backward_upstream_vs_oracle(rng, fmt):
    for i, (M, K, N) in enumerate(UPSTREAM):
        rule = RULES[(i + FMTS.index(fmt)) % 3]
        group = "wrapx" if i % 2 == 0 else "1x32"
        _run_and_check(rng, M, K, N, fmt, rule, group, "float32" if i % 2 == 0 else "bfloat16")


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("group", ["1x32", "wrapx"])
def test_forward_vs_oracle(rng, fmt, group):
    for (M, K, N) in [(33, 256, 97), (5, 384, 40), (64, 640, 33)] + ([(7, 45, 3)] if group == "1x32" else []):
        x = rng.standard_normal((M, K)).astype(BF16)
        w = rng.standard_normal((N, K)).astype(BF16)
        for rule in RULES:
            y = mxfp8.matmul_mxfp8(x, w, float8_dtype=fmt, output_dtype="float32", scale_rule=rule,
                                   quant_scheme=group)
            exact, S, k = O.gemm(x.astype(np.float64), w.astype(np.float64), O.fmt_name(fmt), rule, group)
            _check_bound(y, exact, S, k, "float32", f"forward {M},{K},{N} {fmt} {rule} {group}")


def test_forward_bias(rng):
    """bias: the bias-less sum as float32 plus bias[n] in one float32 addition (numpy's), rounded once to the output
    dtype (ml_dtypes' and numpy's RNE), bit for bit; bias of any float dtype and stride; shape errors."""
    M, K, N = 37, 96, 41
    x = rng.standard_normal((M, K)).astype(BF16)
    w = rng.standard_normal((N, K)).astype(BF16)
    y32 = mxfp8.matmul_mxfp8(x, w, output_dtype="float32")
    for bdt in (np.float32, BF16, np.float16):
        full = (rng.standard_normal(2 * N) * 4).astype(np.float32).astype(bdt)
        for b in (full[:N], full[::2]):  # contiguous and strided
            want32 = y32 + b.astype(np.float32)[None, :]
            got32 = mxfp8.matmul_mxfp8(x, w, output_dtype="float32", bias=b)
            assert got32.dtype == np.float32 and np.array_equal(got32.view(np.uint32), want32.view(np.uint32))
            for od, npdt in (("bfloat16", BF16), ("float16", np.float16)):
                got = mxfp8.matmul_mxfp8(x, w, output_dtype=od, bias=b)
                want = want32.astype(npdt)
                assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), (bdt, od)
    assert np.array_equal(mxfp8.matmul_mxfp8(x, w, output_dtype="float32", bias=[0.5] * N), y32 + np.float32(0.5))
    with pytest.raises(ValueError, match="bias"):
        mxfp8.matmul_mxfp8(x, w, bias=np.zeros((1, N), np.float32))
    with pytest.raises(mxfp8.MXFP8Error, match="bias"):
        mxfp8.matmul_mxfp8(x, w, bias=np.zeros(N + 1, np.float32))
    with pytest.raises(TypeError, match="bias"):
        mxfp8.matmul_mxfp8(x, w, bias=np.zeros(N, np.int32))


def _nki_criteria(k, g):
    k = np.asarray(k).astype(np.float64)
    g = np.asarray(g).astype(np.float64)
    atol = 0.2 * np.abs(g).max()
    allclose = np.all(np.abs(k - g) <= atol + 1e-3 * np.abs(g))
    cos = (k * g).sum() / (np.linalg.norm(k) * np.linalg.norm(g))
    ne = np.linalg.norm(k - g) / (np.linalg.norm(k) + np.linalg.norm(g))
    return allclose, cos, ne


@pytest.mark.parametrize("shape", UPSTREAM)
def test_nki_criteria_upstream(shape):
    M, K, N = shape
    rng = np.random.default_rng(42)
    dy = rng.standard_normal((M, N)).astype(BF16)
    w = rng.standard_normal((N, K)).astype(BF16)
    x = rng.standard_normal((M, K)).astype(BF16)
    dx, dw = mxfp8.matmul_mxfp8_backward(dy, w, x)  # seed defaults: e5m2, bf16 output
    assert dx.dtype == BF16 and dw.dtype == BF16
    # golden: unquantized, BF16 inputs, FP32 accumulation (numpy, independent of the library)
    gx = dy.astype(np.float32) @ w.astype(np.float32)
    gw = dy.astype(np.float32).T @ x.astype(np.float32)
    for name, k, g in (("input_grad", dx, gx), ("weight_grad", dw, gw)):
        allclose, cos, ne = _nki_criteria(k, g)
        assert allclose and cos >= 0.995 and ne <= 0.10, (name, allclose, cos, ne)
        r = mxfp8.compare_nki(k, g)
        assert r["passed"] and r["allclose"] == allclose
        assert abs(r["cosine"] - cos) < 1e-9 and abs(r["norm_euclid"] - ne) < 1e-9
    # the library's own unquantized golden agrees with numpy's to FP32 accumulation accuracy
    lgx, _ = mxfp8.matmul_mxfp8_backward_golden(dy, w, x)
    assert np.allclose(lgx, gx, rtol=1e-4, atol=1e-3 * np.abs(gx).max())


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint8)


def test_knobs_and_threads_bitwise(rng):
    for (M, K, N) in [(96, 160, 224), (127, 129, 131), (200, 64, 70)]:
        dy, w, x = _inputs(rng, M, K, N)
        mxfp8.set_num_threads(1)
        try:
            base = mxfp8.matmul_mxfp8_backward(dy, w, x)
            variants = []
            for threads in (1, 2):
                mxfp8.set_num_threads(threads)
                for order in mm.LOOP_ORDERS:
                    for lnc2 in (True, False):
                        for shard in (True, False):
                            for spill in (True, False):
                                variants.append(dict(tile_loop_order=order, run_with_lnc2=lnc2,
                                                     lnc_2_shard_rhs=shard, spill_reload=spill))
                for cfg in (mm.MatmulMxfp8KernelConfig(tile_m=8, tile_n=32, tile_k=5, TILES_IN_BLOCK_M=1,
                                                       TILES_IN_BLOCK_N=3, block_loop_order="nkm"),
                            mm.MatmulMxfp8KernelConfig(tile_m=100, tile_n=40, tile_k=1000, TILES_IN_BLOCK_M=7,
                                                       lnc_2_shard_rhs=False, spill_reload=True,
                                                       tile_loop_order="kmn"),
                            mm.MatmulMxfp8KernelConfig(M=M, K=N, N=K, float8_dtype="float8_e5m2")):
                    variants.append(dict(input_grad_config=cfg,
                                         weight_grad_config=mm.MatmulMxfp8KernelConfig(tile_k=3, tile_n=64)))
                for v in variants[-(len(variants) // 2 if threads == 2 else len(variants)):]:
                    got = mxfp8.matmul_mxfp8_backward(dy, w, x, **v)
                    for g, b, nm in zip(got, base, ("input_grad", "weight_grad")):
                        assert np.array_equal(_bits(g), _bits(b)), (nm, threads, v)
        finally:
            mxfp8.set_num_threads(0)


def _prequant_operands(dy, w, x, fmt, rule, group):
    """Oracle-quantized operands of the backward: dY along N (F = M), W along N (F = K), X along M (F = K).
    Returns dict name -> (codes in the tensor's own orientation, compact scales, contraction-first codes)."""
    f = O.fmt_name(fmt)
    cdy, sdy = O.quantize(dy.astype(np.float64), f, rule, group)          # [M, N], scales [M, G(N)]
    cwt, sw = O.quantize(w.astype(np.float64).T, f, rule, group)         # [K, N], scales [K, G(N)]
    cxt, sx = O.quantize(x.astype(np.float64).T, f, rule, group)         # [K, M], scales [K, G(M)]
    return {"output_grad": (cdy, sdy, cdy.T), "weights": (cwt.T, sw, cwt.T), "input_activation": (cxt.T, sx, cxt.T)}


@pytest.mark.parametrize("fmt,group", [("float8_e4m3fn", "1x32"), ("float8_e5m2", "1x32"),
                                       ("float8_e4m3fn", "wrapx"), ("float8_e5m2", "wrapx")])
def test_prequantized_every_layout_bitwise(rng, fmt, group):
    M, K, N = 128, 72, 640 if group == "wrapx" else 256  # M, N % 128 == 0: swizzled arrangement and wrapX apply
    rule = "ocp" if group == "wrapx" else "nki"
    dy, w, x = _inputs(rng, M, K, N, np.float32, spread=6)
    kw0 = dict(float8_dtype=fmt, output_dtype="float32", scale_rule=rule, quant_scheme=group)
    ref_dx, ref_dw = mxfp8.matmul_mxfp8_backward(dy, w, x, **kw0)
    q = _prequant_operands(dy, w, x, fmt, rule, group)
    # dW of a pre-quantized dY is computed from dY's dequantized values (re-quantized along M)
    dy_deq = O.dequantize(q["output_grad"][0], q["output_grad"][1], group).astype(np.float32)
    _, ref_dw_deq = mxfp8.matmul_mxfp8_backward(dy_deq, w, x, **kw0)
    contraction = {"output_grad": N, "weights": N, "input_activation": M}
    cases = [(lay, False, False) for lay in ("compact", "nki_unpacked", "nki_packed", "swizzle_128x4")]
    cases += [("compact", True, False), ("swizzle_128x4", True, False), ("compact", False, True),
              ("nki_unpacked", True, True), ("packing", False, False)]
    for lay, x4, swz in cases:
        for name in ("output_grad", "weights", "input_activation"):
            codes, sc, cf = q[name]
            C = contraction[name]
            layout = "nki_packed" if lay == "packing" else lay
            scales = O.to_layout(sc, C, layout)
            if swz:
                arr = O.swizzle(cf)                      # [C/4, 4F]
                if x4:
                    arr = O.pack_x4(arr)                 # [C/4, F]
            else:
                if x4:
                    # pack along the contraction axis: dY [M, N] along its last axis; W, X along their first axis
                    arr = O.pack_x4(codes) if name == "output_grad" else O.pack_x4(cf.T).T
                else:
                    arr = codes
            kw = {"input_grad_config": None}
            args = {"output_grad": dy, "weights": w, "input_activation": x}
            args[name] = arr
            kw[{"output_grad": "output_grad_scales", "weights": "weight_scales",
                "input_activation": "input_scales"}[name]] = scales
            kw[{"output_grad": "output_grad_is_swizzled", "weights": "weights_is_swizzled",
                "input_activation": "input_is_swizzled"}[name]] = swz
            if lay == "packing":
                kw["use_scale_packing"] = True
            else:
                kw["scale_layout"] = layout
            dx, dw = mxfp8.matmul_mxfp8_backward(args["output_grad"], args["weights"], args["input_activation"],
                                                 float8_dtype=fmt, output_dtype="float32", scale_rule=rule,
                                                 quant_scheme=group, **kw)
            what = f"{name} layout={lay} x4={x4} swizzled={swz}"
            assert np.array_equal(_bits(dx), _bits(ref_dx)), "input_grad " + what
            want_dw = ref_dw_deq if name == "output_grad" else ref_dw
            assert np.array_equal(_bits(dw), _bits(want_dw)), "weight_grad " + what


def test_swizzled_high_precision_bitwise(rng):
    M, K, N = 256, 40, 384
    dy, w, x = _inputs(rng, M, K, N)
    ref = mxfp8.matmul_mxfp8_backward(dy, w, x, float8_dtype="float8_e4m3fn")
    got = mxfp8.matmul_mxfp8_backward(O.swizzle(dy.T), O.swizzle(w), O.swizzle(x), float8_dtype="float8_e4m3fn",
                                      output_grad_is_swizzled=True, weights_is_swizzled=True, input_is_swizzled=True)
    for g, r in zip(got, ref):
        assert np.array_equal(_bits(g), _bits(r))


def test_forward_prequantized_bitwise(rng):
    M, K, N = 40, 100, 70
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    ref = mxfp8.matmul_mxfp8(x, w, float8_dtype="float8_e4m3fn", output_dtype="float32")
    cx, sx = O.quantize(x, "e4m3")
    cw, sw = O.quantize(w, "e4m3")
    for lay in ("compact", "nki_unpacked", "nki_packed", "swizzle_128x4"):
        y = mxfp8.matmul_mxfp8(cx, O.pack_x4(cw), float8_dtype="float8_e4m3fn", output_dtype="float32",
                               input_scales=O.to_layout(sx, K, lay), weight_scales=O.to_layout(sw, K, lay),
                               scale_layout=lay, K=K)
        assert np.array_equal(_bits(y), _bits(ref)), lay
    y = mxfp8.matmul_mxfp8(cx, cw, float8_dtype="float8_e4m3fn", output_dtype="float32", use_scale_packing=True,
                           input_scales=O.to_layout(sx, K, "nki_packed"), weight_scales=O.to_layout(sw, K, "nki_packed"))
    assert np.array_equal(_bits(y), _bits(ref))
    with pytest.raises(mxfp8.MXFP8Error) as e:  # enable_scale_packing asserts the packed layout
        mxfp8.matmul_mxfp8(cx, cw, float8_dtype="float8_e4m3fn", config=mm.MatmulMxfp8KernelConfig(enable_scale_packing=True),
                           input_scales=sx, weight_scales=sw)
    assert e.value.status == 2


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_poisons_exactly_its_groups(rng, bad):
    M, K, N = 70, 50, 90
    dy, w, x = _inputs(rng, M, K, N, np.float32)
    i, j = 37, 41
    dy[i, j] = bad
    dx, dw = mxfp8.matmul_mxfp8_backward(dy, w, x, output_dtype="float32")
    # dX phase: the group of row i along N holding j -> every dX[i, :] is NaN, nothing else.
    want_x = np.zeros((M, K), bool)
    want_x[i, :] = True
    # dW phase: the group of column j along M holding i -> every dW[j, :] is NaN, nothing else.
    want_w = np.zeros((N, K), bool)
    want_w[j, :] = True
    assert np.array_equal(np.isnan(dx), want_x)
    assert np.array_equal(np.isnan(dw), want_w)
    assert np.all(np.isfinite(dx[~want_x])) and np.all(np.isfinite(dw[~want_w]))


def test_outputs_fully_written(monkeypatch, rng):
    def nan_empty(shape, code):
        a = np.zeros(tuple(int(s) for s in shape), dtype=mxfp8._lib.np_dtype(code))
        a[...] = np.nan
        return a
    monkeypatch.setattr(mm._lib, "empty", nan_empty)
    for (M, K, N) in [(33, 65, 97), (1, 1, 1), (8, 0, 5), (0, 4, 3)]:
        dy, w, x = _inputs(rng, M, K, N)
        for od in ("bfloat16", "float32", "float16"):
            dx, dw = mxfp8.matmul_mxfp8_backward(dy, w, x, output_dtype=od)
            assert not np.isnan(dx.astype(np.float32)).any() and not np.isnan(dw.astype(np.float32)).any()
        y = mxfp8.matmul_mxfp8(x, w, output_dtype="float32")
        assert y.shape == (M, N) and not np.isnan(y).any()


def test_zero_dimensions():
    for (M, K, N) in [(0, 5, 7), (5, 0, 7), (5, 7, 0), (0, 0, 0)]:
        dy = np.ones((M, N), BF16)
        w = np.ones((N, K), BF16)
        x = np.ones((M, K), BF16)
        dx, dw = mxfp8.matmul_mxfp8_backward(dy, w, x)
        assert dx.shape == (M, K) and dw.shape == (N, K)
        assert np.all(dx.astype(np.float32) == 0) and np.all(dw.astype(np.float32) == 0)


def test_option_errors():
    dy = np.ones((4, 5), BF16)
    w = np.ones((5, 6), BF16)
    x = np.ones((4, 6), BF16)
    # "float8_e4m3fn" or "float8_e5m2"; any other string is an error ("float8_e4m3" is ml_dtypes' IEEE-like
    # e4m3 with max 240, a different format; no case or short aliases)
    for bad in ("float8_e4m3", "e4m3", "e4m3fn", "E4M3", "e5m2", "FLOAT8_E5M2", "Float8_e4m3fn", " float8_e5m2",
                "fp8", "float8_e3m4", "bfloat16", "", ml_dtypes.float8_e4m3, ml_dtypes.float8_e4m3b11fnuz):
        with pytest.raises(ValueError):
            mxfp8.matmul_mxfp8_backward(dy, w, x, float8_dtype=bad)
        with pytest.raises(ValueError):
            mxfp8.matmul_mxfp8(x, w, float8_dtype=bad)
        with pytest.raises(ValueError):
            mxfp8.blockwise_mm_bwd_mxfp8(np.ones((2, 32), np.float32), np.ones((2, 1), np.float32),
                                         np.ones((1, 32, 2, 32), np.float32), np.ones((1, 32, 32), np.float32),
                                         np.array([0, 1], np.int32), np.array([[0]], np.int32),
                                         np.ones((2, 32), np.float32), 2, config=mxfp8.MXFP8MOEBwdConfig(
                                             fp8_x4_dtype=bad))
    # flags are bool or 0/1; "no" is not taken as true, 5 and -7 are not taken as "on"
    for flag in ("run_with_lnc2", "lnc_2_shard_rhs", "use_scale_packing", "spill_reload", "output_grad_is_swizzled",
                 "weights_is_swizzled", "input_is_swizzled"):
        with pytest.raises(TypeError, match=flag):
            mxfp8.matmul_mxfp8_backward(dy, w, x, **{flag: "no"})
        with pytest.raises(ValueError, match=flag):
            mxfp8.matmul_mxfp8_backward(dy, w, x, **{flag: 5})
    for flag in ("run_with_lnc2", "spill_reload", "enable_scale_packing", "lnc_2_shard_rhs"):
        with pytest.raises(ValueError, match=flag):
            mxfp8.matmul_mxfp8_backward(dy, w, x, input_grad_config=mm.MatmulMxfp8KernelConfig(**{flag: -7}))
    ref = mxfp8.matmul_mxfp8_backward(dy, w, x)
    for kw in (dict(run_with_lnc2=np.bool_(False)), dict(run_with_lnc2=0, lnc_2_shard_rhs=1), dict(spill_reload=1)):
        assert all(np.array_equal(a, b) for a, b in zip(mxfp8.matmul_mxfp8_backward(dy, w, x, **kw), ref)), kw
    for ok in ("float8_e4m3fn", "float8_e5m2", ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
        mxfp8.matmul_mxfp8_backward(dy, w, x, float8_dtype=ok)
    for bad in ("float8_e4m3", "float8_e4m3fn", "e4m3fn", ml_dtypes.float8_e4m3):  # quantize: the library's names
        with pytest.raises(ValueError):
            mxfp8.quantize(np.ones(32, np.float32), fmt=bad)
    with pytest.raises(ValueError):
        mxfp8.matmul_mxfp8_backward(dy, w, x, tile_loop_order="xyz")
    with pytest.raises(ValueError):
        mxfp8.matmul_mxfp8_backward(dy, w, x, output_dtype="int8")
    with pytest.raises(ValueError):
        mxfp8.matmul_mxfp8_backward(dy, w, x, input_grad_config=mm.MatmulMxfp8KernelConfig(float8_dtype="float8_e4m3fn"))
    with pytest.raises(mxfp8.MXFP8Error) as e:
        mxfp8.matmul_mxfp8_backward(dy, np.ones((5, 7), BF16), x)
    assert e.value.status == 3  # SHAPE_MISMATCH
    with pytest.raises(mxfp8.MXFP8Error) as e:
        mxfp8.matmul_mxfp8_backward(dy, w, x, quant_scheme="wrapx")
    assert e.value.status == 9  # UNSUPPORTED
    with pytest.raises(mxfp8.MXFP8Error) as e:  # codes without scales
        mxfp8.matmul_mxfp8_backward(dy.astype(ml_dtypes.float8_e5m2), w, x)
    assert e.value.status == 1


def test_error_messages_name_layouts_full_shapes_and_contraction_length():
    """Messages a user can act on: the scale layout by name (not 'layout 0'), the whole shape of a bad view (not
    '[64, ...]'), and wrapX's length as the contraction length (for dW that is M, not 'K')."""
    x = np.ones((64, 64), np.float32)
    w = np.ones((48, 64), np.float32)
    xq, xs = mxfp8.quantize(x, axis=1)
    wq, ws = mxfp8.quantize(w, axis=1)
    for bad, shape in ((xs[:, :1], "[64, 1]"), (xs[None], "[1, 64, 2]")):
        with pytest.raises(mxfp8.MXFP8Error) as e:
            mxfp8.matmul_mxfp8(xq, wq, float8_dtype="float8_e4m3fn", input_scales=bad, weight_scales=ws)
        msg = str(e.value)
        assert "layout compact" in msg and f"got {shape}" in msg and "..." not in msg, msg
    dy, W, X = np.ones((100, 128), BF16), np.ones((128, 128), BF16), np.ones((100, 128), BF16)
    with pytest.raises(mxfp8.MXFP8Error) as e:
        mxfp8.matmul_mxfp8_backward(dy, W, X, quant_scheme="wrapx")
    msg = str(e.value)
    assert "contraction length" in msg and "100" in msg and "K = 100" not in msg, msg
    with pytest.raises(mxfp8.MXFP8Error) as e:
        mxfp8.from_scale_layout(np.zeros((3, 5), np.uint8), 64, "nki_packed", rows=64)
    assert "layout nki_packed" in str(e.value) and "got [3, 5]" in str(e.value), str(e.value)
