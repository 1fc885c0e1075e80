"""Quantization statistics and stochastic rounding of mxfp8.quantize, against oracles written here with numpy and
ml_dtypes (mx_oracle.py for the nearest-rounding codes; Philox-4x32-10 and the stochastic rounding rule below):

  * statistics: counts and sums computed from the inputs and the oracle's codes, on tensors built with known numbers
    of saturated, flushed, subnormal, NaN/Inf and all-zero groups; outputs bitwise unchanged with statistics on; the
    same statistics for 1 and 2 threads, for transposed storage and for the other ISA path (a subprocess under
    MXFP8_ISA=scalar, or avx512 when this one runs scalar);
  * stochastic rounding: every code equal to the oracle (generator words by the documented logical index); bitwise
    reproducible across threads and ISA paths; every result one of the two FP8 neighbours of x / 2^e; no NaN/Inf
    from finite input; and over many seeds the mean of the dequantized values converges to x (Hoeffding bounds with
    a false-failure probability below 1e-6 in total).
"""

import json
import math
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import mxfp8
import mx_oracle

FMTS = ("e4m3", "e5m2")
RULES = ("nki", "ocp", "rceil")
GRID = {f: np.arange(128, dtype=np.uint8).view(mx_oracle.FMT[f]["dtype"]).astype(np.float64) for f in FMTS}
for _f in FMTS:  # the non-negative finite values, in code order
    GRID[_f] = GRID[_f][np.isfinite(GRID[_f])]


# ---- Philox-4x32-10 and the element words (mxfp8.h, "Stochastic rounding") ----
def philox4x32_10(c, k0, k1):
    """c: uint64 array [4, n] holding 32-bit counter words; k0, k1: key words. Returns the 4 output words."""
    M0, M1, W0, W1, m32 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85, 0xFFFFFFFF
    c0, c1, c2, c3 = (w.astype(np.uint64) for w in c)
    for r in range(10):
        if r:
            k0, k1 = (k0 + W0) & m32, (k1 + W1) & m32
        p0, p1 = c0 * np.uint64(M0), c2 * np.uint64(M1)
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0), p1 & np.uint64(m32),
                          (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1), p0 & np.uint64(m32))
    return c0, c1, c2, c3


def test_philox_known_answers():
    """The Random123 known-answer vectors (counter, key -> output) of Philox-4x32-10."""
    kat = [((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
           ((2**32 - 1,) * 4, (2**32 - 1,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
           ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
            (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]
    for ctr, key, want in kat:
        out = philox4x32_10(np.array(ctr, np.uint64).reshape(4, 1), *key)
        assert [int(o[0]) for o in out] == list(want)


def words(seed, stream, idx):
    """The 32-bit word of each logical index (int64 array)."""
    q = idx.astype(np.uint64) >> np.uint64(2)
    c = np.stack([q & np.uint64(0xFFFFFFFF), q >> np.uint64(32), np.full_like(q, stream & 0xFFFFFFFF),
                  np.full_like(q, stream >> 32)])
    out = np.stack(philox4x32_10(c, seed & 0xFFFFFFFF, seed >> 32))
    return out[idx & 3, np.arange(idx.size)].reshape(idx.shape)


def sr_oracle(x, scales, fmt, axis, seed, stream):
    """Stochastic codes of x (float32, any shape) along `axis` with the given (library's = oracle's) scales, 1x32."""
    x = np.moveaxis(np.asarray(x, np.float32), axis, -1)
    s = np.repeat(np.moveaxis(scales, axis, -1), 32, axis=-1)[..., :x.shape[-1]].astype(np.int64)
    idx = np.moveaxis(np.arange(x.size, dtype=np.int64).reshape(np.moveaxis(x, -1, axis).shape), axis, -1)
    y = x * np.ldexp(np.float32(1), 127 - s).astype(np.float32)  # the FP32 product
    a = np.minimum(np.abs(y).astype(np.float64), GRID[fmt][-1])
    lo = np.searchsorted(GRID[fmt], a, side="right") - 1
    hi = np.minimum(lo + 1, GRID[fmt].size - 1)
    step = GRID[fmt][hi] - GRID[fmt][lo]
    frac = np.where(step > 0, (a - GRID[fmt][lo]) / np.where(step > 0, step, 1), 0)
    F = np.floor(np.ldexp(frac, 32))
    up = words(seed, stream, idx.ravel()).reshape(a.shape).astype(np.float64) < F
    code = (lo + up).astype(np.uint8) | np.where(np.signbit(y), 0x80, 0).astype(np.uint8)
    code = np.where(s == 255, mx_oracle.FMT[fmt]["nan"] | np.where(np.signbit(x), 0x80, 0), code).astype(np.uint8)
    return np.moveaxis(code, -1, axis)


# ---- statistics ----
def top_finite(fmt, s):
    """Per scale code s: the largest FP8 value times 2^(s - 127) that is at most FLT_MAX (an element beyond it is
    saturated: include/mxfp8.h, "Values near FLT_MAX")."""
    g = GRID[fmt][np.isfinite(GRID[fmt])]
    with np.errstate(over="ignore", invalid="ignore"):
        prod = g[None, :] * np.ldexp(1.0, np.clip(np.asarray(s, np.int64), 0, 254) - 127).reshape(-1, 1)
    ok = prod <= float(np.finfo(np.float32).max)
    return np.where(ok, prod, 0).max(axis=1).reshape(np.shape(s))


def stats_oracle(x, fmt, axis, rule):
    """Counts and sums of quantizing x (float32) along axis, 1x32, from the oracle's codes and float64 arithmetic."""
    codes, scales = mx_oracle.quantize(x, fmt, axis, rule, "1x32")
    xm = np.moveaxis(np.asarray(x, np.float32), axis, -1).astype(np.float64)
    cm = np.moveaxis(codes, axis, -1)
    sm = np.moveaxis(scales, axis, -1)
    L = xm.shape[-1]
    G = sm.shape[-1]
    pad = G * 32 - L
    xg = np.pad(xm, [(0, 0)] * (xm.ndim - 1) + [(0, pad)]).reshape(xm.shape[:-1] + (G, 32))
    cg = np.pad(cm, [(0, 0)] * (cm.ndim - 1) + [(0, pad)]).reshape(cm.shape[:-1] + (G, 32))
    valid = np.pad(np.ones(L, bool), (0, pad)).reshape(G, 32)
    s = sm.astype(np.int64)[..., None]
    finite = (s != 255)
    zero_group = finite[..., 0] & np.all(xg == 0, axis=-1)
    v = np.abs(cg.view(mx_oracle.FMT[fmt]["dtype"]).astype(np.float64)) * np.ldexp(1.0, s - 127)
    y = np.abs(xg) * np.ldexp(1.0, 127 - s)
    m = 2 if fmt == "e5m2" else 3
    mag = cg & 0x7F
    use = finite & valid
    return {
        "elements": int(x.size), "groups": int(sm.size),
        "saturated": int(np.sum(use & ((y > mx_oracle.FMT[fmt]["max_normal"]) | (np.abs(xg) > top_finite(fmt, s))))),
        "flushed_to_zero": int(np.sum(use & (xg != 0) & (mag == 0))),
        "subnormal": int(np.sum(use & (mag != 0) & (mag < (1 << m)))),
        "nonfinite_groups": int(np.sum(sm == 255)), "zero_groups": int(np.sum(zero_group)),
        "scale_histogram": np.bincount(sm.ravel(), minlength=256).tolist(),
        "sum_sq_error": float(np.sum(np.where(use, (np.abs(xg) - v) ** 2, 0))),
        "sum_sq_signal": float(np.sum(np.where(use, xg ** 2, 0))),
    }


def check_stats(st, want, what):
    for k in ("elements", "groups", "saturated", "flushed_to_zero", "subnormal", "nonfinite_groups", "zero_groups",
              "scale_histogram"):
        assert st[k] == want[k], f"{what}: {k} = {st[k]}, oracle {want[k]}"
    for k in ("sum_sq_error", "sum_sq_signal"):
        assert st[k] == pytest.approx(want[k], rel=1e-6), f"{what}: {k}"
    if want["sum_sq_error"] > 0:
        assert st["sqnr_db"] == pytest.approx(10 * math.log10(want["sum_sq_signal"] / want["sum_sq_error"]),
                                              abs=1e-5)


def known_tensor(fmt):
    """[8, 256] float32 whose groups (along axis 1) have known contents under the OCP rule: row 0 saturating groups
    (amax 1.99 * 2^k, so x / 2^e reaches 509 / 65216 > max normal), row 1 elements far below amax (flushed),
    row 2 subnormal elements, row 3 one NaN and one Inf group, row 4 all-zero groups (+0 and -0), rows 5-7 N(0, 1)."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((8, 256)).astype(np.float32)
    emax, emin = mx_oracle.FMT[fmt]["emax"], (-14 if fmt == "e5m2" else -6)
    x[0] = np.tile(np.array([1.99, -1.9, 1.0] + [0.5] * 29, np.float32), 8) * np.float32(4.0)
    # amax 1: e = -emax, so x / 2^e = x * 2^emax: 2^-20 is below half the smallest subnormal, 2^(emin-1) subnormal
    x[1] = np.tile(np.array([1.0] + [2.0 ** -(emax + 20)] * 5 + [0.25] * 26, np.float32), 8)
    x[2] = np.tile(np.array([1.0] + [-(2.0 ** (emin - 1 - emax))] * 7 + [0.5] * 24, np.float32), 8)
    x[3, 5], x[3, 40] = np.nan, -np.inf
    x[4] = 0.0
    x[4, 1::2] = -0.0
    return x


@pytest.mark.parametrize("fmt", FMTS)
def test_stats_known_counts(fmt):
    x = known_tensor(fmt)
    d0, s0 = mxfp8.quantize(x, fmt, axis=1, scale_rule="ocp")
    d, s, st = mxfp8.quantize(x, fmt, axis=1, scale_rule="ocp", stats=True)
    assert np.array_equal(d.view(np.uint8), d0.view(np.uint8)) and np.array_equal(s, s0), "stats changed outputs"
    want = stats_oracle(x, fmt, 1, "ocp")
    check_stats(st, want, "known tensor")
    # the construction's counts, independently of the oracle
    assert st["saturated"] >= 2 * 8 and st["nonfinite_groups"] == 2 and st["zero_groups"] == 8
    assert st["flushed_to_zero"] >= 5 * 8 and st["subnormal"] >= 7 * 8
    assert st["scale_histogram"][255] == 2 and sum(st["scale_histogram"]) == st["groups"] == 64


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("axis", (0, 1))
def test_stats_random_against_oracle(fmt, rule, axis):
    rng = np.random.default_rng(hash((fmt, rule, axis)) % 2**32)
    x = (rng.standard_normal((70, 97)) * np.exp2(rng.integers(-30, 30, (70, 1)))).astype(np.float32)
    x[rng.random(x.shape) < 0.01] = 0
    _, _, st = mxfp8.quantize(x, fmt, axis=axis, scale_rule=rule, stats=True)
    check_stats(st, stats_oracle(x, fmt, axis, rule), f"{fmt} {rule} axis {axis}")
    # transposed storage and 2 threads: the same statistics exactly
    _, _, st_t = mxfp8.quantize(np.asfortranarray(x), fmt, axis=axis, scale_rule=rule, stats=True)
    mxfp8.set_num_threads(2)
    try:
        big = np.tile(x, (40, 1))
        _, _, st2 = mxfp8.quantize(big, fmt, axis=axis, scale_rule=rule, stats=True)
        mxfp8.set_num_threads(1)
        _, _, st1 = mxfp8.quantize(big, fmt, axis=axis, scale_rule=rule, stats=True)
    finally:
        mxfp8.set_num_threads(0)
    assert st_t == st and st1 == st2


def test_stats_bfloat16_input():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((33, 130)).astype(ml_dtypes.bfloat16)
    _, _, st = mxfp8.quantize(x, "e4m3", stats=True)
    check_stats(st, stats_oracle(x.astype(np.float32), "e4m3", -1, "nki"), "bfloat16")


# ---- the other ISA path, in a subprocess ----
_CHILD = r"""
import json, sys
import numpy as np, mxfp8
x = np.random.default_rng(3).standard_normal((64, 300)).astype(np.float32) * 7
out = {}
for axis in (0, 1):
    for rounding in ("nearest", "stochastic"):
        d, s, st = mxfp8.quantize(x, "e4m3", axis=axis, scale_rule="ocp", rounding=rounding, seed=99, stats=True)
        out[f"{axis} {rounding}"] = [d.view(np.uint8).tobytes().hex(), s.tobytes().hex(), st]
out["isa"] = mxfp8.info()["isa"]
json.dump(out, sys.stdout)
"""


def _run_child(isa):
    env = dict(os.environ, MXFP8_ISA=isa)
    r = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_same_bits_and_statistics_on_both_isa_paths():
    """Codes, scales and every statistic (sums included) agree between the scalar reference and AVX-512."""
    if not mxfp8.info()["has_avx512f"]:
        pytest.skip("this CPU has no AVX-512: a single ISA path")
    a, b = _run_child("scalar"), _run_child("avx512")
    assert a.pop("isa") == "scalar" and b.pop("isa") in ("avx512", "amx")
    assert a == b


# ---- stochastic rounding ----
def _sr_cases():
    for fmt in FMTS:
        for rule in RULES:
            for axis in (0, 1):
                yield fmt, rule, axis


@pytest.mark.parametrize("fmt,rule,axis", list(_sr_cases()))
def test_stochastic_codes_match_the_oracle(fmt, rule, axis):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((40, 75)) * np.exp2(rng.integers(-12, 12, (40, 1)))).astype(np.float32)
    x[3, 7] = np.nan
    seed, stream = 0x1234_5678_9ABC_DEF0, 2**40 + 3
    d, s = mxfp8.quantize(x, fmt, axis=axis, scale_rule=rule, rounding="stochastic", seed=seed, stream=stream)
    _, s_near = mxfp8.quantize(x, fmt, axis=axis, scale_rule=rule)
    assert np.array_equal(s, s_near), "stochastic rounding changed a scale"
    want = sr_oracle(x, s, fmt, axis, seed, stream)
    assert np.array_equal(d.view(np.uint8), want), f"{np.sum(d.view(np.uint8) != want)} codes differ"
    # storage order and threads do not matter
    d2, _ = mxfp8.quantize(np.asfortranarray(x), fmt, axis=axis, scale_rule=rule, rounding="stochastic", seed=seed,
                           stream=stream)
    assert np.array_equal(d2.view(np.uint8), want)


def test_stochastic_reproducible_across_threads():
    x = np.random.default_rng(1).standard_normal((512, 384)).astype(ml_dtypes.bfloat16)
    outs = []
    for nt in (1, 2):
        mxfp8.set_num_threads(nt)
        try:
            outs.append(mxfp8.quantize(x, "e5m2", axis=0, rounding="stochastic", seed=5)[0].view(np.uint8))
        finally:
            mxfp8.set_num_threads(0)
    assert np.array_equal(outs[0], outs[1])
    other = mxfp8.quantize(x, "e5m2", axis=0, rounding="stochastic", seed=6)[0].view(np.uint8)
    assert np.mean(other != outs[0]) > 0.2, "another seed should change many codes"


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("rule", RULES)
def test_stochastic_neighbours_and_finite(fmt, rule):
    """Every code is one of the two FP8 neighbours of x / 2^e (saturated to max normal), values on the grid never
    move, and finite inputs (up to FLT_MAX) never give NaN/Inf."""
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((64, 128)) * np.exp2(rng.integers(-140, 120, (64, 1)))).astype(np.float32)
    x[0, :32] = np.float32(3.4028235e38) * np.float32(rng.random(32))
    x[1, :32] = np.float32(3.4028235e38)
    x[2] = rng.choice(GRID[fmt][1:], 128).astype(np.float32) * np.float32(2.0 ** -3)  # exact FP8 values
    x[2, ::32] = GRID[fmt][-1] * 2.0 ** -3
    codes, scales = mx_oracle.quantize(x, fmt, -1, rule, "1x32")
    for seed in range(20):
        d, s = mxfp8.quantize(x, fmt, scale_rule=rule, rounding="stochastic", seed=seed)
        assert np.array_equal(s, scales)
        c = d.view(np.uint8)
        v = np.abs(d.astype(np.float64))
        assert np.all(np.isfinite(v)), "a finite input gave NaN or Inf"
        y = np.minimum(np.abs(x.astype(np.float64)) * np.ldexp(1.0, 127 - np.repeat(scales, 32, axis=1).astype(int)),
                       GRID[fmt][-1])
        lo = np.searchsorted(GRID[fmt], y, side="right") - 1
        assert np.all(((c & 0x7F) == lo) | ((c & 0x7F) == lo + 1)), "a code is not a neighbour of x / 2^e"
        on_grid = GRID[fmt][lo] == y
        assert np.array_equal(c[on_grid], codes[on_grid]), "a value on the FP8 grid moved"
        assert np.array_equal(np.signbit(d.astype(np.float32)) & (v > 0), np.signbit(x) & (v > 0))


@pytest.mark.parametrize("fmt", FMTS)
def test_stochastic_mean_converges_to_x(fmt):
    """Over S seeds the mean of the dequantized values of each element converges to x. Each sample is lo or
    lo + ulp, with mean within 2^-32 ulp of x; by Hoeffding, P(|mean - E| >= t) <= 2 exp(-2 S t^2 / ulp^2). The
    bounds below are set so that the probability that any of the n + 1 checks fails spuriously is below 1e-6."""
    rng = np.random.default_rng(8)
    n, S = 1024, 1500
    x = (rng.standard_normal((8, n // 8)) * np.exp2(rng.integers(-8, 8, (8, 1)))).astype(np.float32)
    _, scales = mxfp8.quantize(x, fmt, scale_rule="nki")
    sv = np.ldexp(1.0, np.repeat(scales, 32, axis=1).astype(np.int64) - 127)
    y = np.abs(x.astype(np.float64)) / sv
    lo = np.searchsorted(GRID[fmt], y, side="right") - 1
    ulp = (GRID[fmt][np.minimum(lo + 1, GRID[fmt].size - 1)] - GRID[fmt][lo]) * sv
    total = np.zeros(x.shape)
    for seed in range(S):
        d, _ = mxfp8.quantize(x, fmt, scale_rule="nki", rounding="stochastic", seed=seed, stream=17)
        total += d.astype(np.float64) * sv
    mean = total / S
    p_each = 1e-6 / (2 * (n + 1))  # per check, both tails
    t = ulp * math.sqrt(math.log(2 / p_each) / (2 * S)) + ulp * 2.0 ** -32
    assert np.all(np.abs(mean - x) <= t), f"max |mean - x| / t = {np.max(np.abs(mean - x) / t):.3f}"
    # the average bias over all elements, in ulps (n * S independent samples)
    bias = np.mean((mean - x) / ulp)
    assert abs(bias) <= math.sqrt(math.log(2 / p_each) / (2 * n * S)) + 2.0 ** -32, f"bias {bias} ulp"
    # nearest rounding would fail this test (its error per element is up to half an ulp)
    dn, _ = mxfp8.quantize(x, fmt, scale_rule="nki")
    assert not np.all(np.abs(dn.astype(np.float64) * sv - x) <= t)
