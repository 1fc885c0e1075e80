"""The numerics options of the CLI: quantize --stats prints the library's own counts (the same as mxfp8.quantize's
stats=True) and --rounding stochastic writes the codes of mxfp8.quantize(rounding="stochastic"); matmul-bwd and
moe-bwd --stats print one row per quantization; moe-bwd runs gpt_oss_swiglu (verdict against the quantized FP64
reference) and stochastic rounding; bad values are usage errors."""

import os
import re
import subprocess

import numpy as np
import pytest

import mxfp8
from build_paths import CLI, require


def run(*args):
    return subprocess.run([require(CLI), *args], capture_output=True, text=True, timeout=300)


@pytest.fixture
def x_file(tmp_path, rng):
    x = (rng.standard_normal((32, 256)) * 3).astype(np.float32)
    x[3, :32] = np.float32(2.0 ** -20)  # with amax 1: flushed to zero (OCP: e = -8, least subnormal 2^-17)
    x[3, 0] = 1.0
    x[3, 1:4] = np.float32(2.0 ** -15)  # subnormal codes
    path = str(tmp_path / "x.npy")
    np.save(path, x)
    return x, path


def test_quantize_stats_are_the_librarys(tmp_path, x_file):
    x, path = x_file
    out = str(tmp_path / "q.safetensors")
    r = run("quantize", path, "-o", out, "--stats", "--scale-rule", "ocp")
    assert r.returncode == 0, r.stderr
    _, _, st = mxfp8.quantize(x, "e4m3", -1, "ocp", stats=True)
    assert st["saturated"] > 0 and st["subnormal"] > 0 and st["flushed_to_zero"] > 0
    m = re.search(r"(\d+) saturated .*?, (\d+) flushed to zero, (\d+) FP8 subnormals", r.stdout)
    assert m and tuple(int(v) for v in m.groups()) == (st["saturated"], st["flushed_to_zero"], st["subnormal"])
    assert f"SQNR {st['sqnr_db']:.2f} dB" in r.stdout


def test_quantize_stochastic_rounding(tmp_path, x_file):
    x, path = x_file
    outs = []
    for i, seed in enumerate(("0x2a", "42", "43")):
        out = str(tmp_path / f"q{i}.safetensors")
        r = run("quantize", path, "-o", out, "--rounding", "stochastic", "--rounding-seed", seed)
        assert r.returncode == 0, r.stderr
        outs.append(mxfp8.load(out)["data"].view(np.uint8))
    want = mxfp8.quantize(x, rounding="stochastic", seed=42)[0].view(np.uint8)
    assert np.array_equal(outs[0], want) and np.array_equal(outs[1], want)
    assert not np.array_equal(outs[2], want)
    for bad in (("--rounding", "up"), ("--rounding-seed", "-1"), ("--rounding-seed", "x")):
        r = run("quantize", path, "-o", str(tmp_path / "bad.safetensors"), *bad)
        assert r.returncode == 2 and "error" in r.stderr and not os.path.exists(tmp_path / "bad.safetensors")


def _table(stdout):
    """Rows of a --stats table: {first column: [numbers]} (the lines between the header and the note)."""
    lines = stdout.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.split()[-2:] == ["SQNR", "dB"]) + 2
    rows = {}
    for ln in lines[start:]:
        if ln.startswith("saturated:"):
            break
        m = re.match(r"(.+?)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\S+)\s+(\S+)$", ln)
        assert m, ln
        rows[m.group(1).strip()] = [int(v) for v in m.groups()[1:7]]
    return rows


def test_matmul_bwd_stats_and_rounding():
    r = run("matmul-bwd", "--M", "64", "--N", "96", "--K", "128", "--stats", "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = _table(r.stdout)
    assert list(rows) == ["output_grad along N", "weights along N", "output_grad along M", "input along M"]
    assert [v[0] for v in rows.values()] == [64 * 96, 96 * 128, 64 * 96, 64 * 128]
    r = run("matmul-bwd", "--M", "64", "--N", "96", "--K", "128", "--stochastic-rounding", "dy,w", "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    r = run("matmul-bwd", "--stochastic-rounding", "dy,bogus")
    assert r.returncode == 2 and "unknown name 'bogus'" in r.stderr


SMALL = ("--H", "64", "--T", "64", "--E", "4", "--B", "16", "--topk", "2", "--I", "64", "--quiet")


@pytest.mark.parametrize("limit", ["7", "0.5"])
def test_moe_bwd_gpt_oss_swiglu(limit):
    r = run("moe-bwd", *SMALL, "--activation", "gpt_oss_swiglu", "--swiglu-limit", limit, "--swiglu-alpha", "1.5")
    assert r.returncode == 0, r.stdout + r.stderr
    assert ", gpt_oss_swiglu, " in r.stdout and "verdict: PASS" in r.stdout


def test_moe_bwd_stats_and_rounding(tmp_path):
    r = run("moe-bwd", *SMALL, "--stats")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = _table(r.stdout)
    # every expert has tokens here; per expert the backward's operands, dY rows as many as X rows
    assert {k.split()[0] for k in rows} == {"0", "1", "2", "3"}
    for e in range(4):
        assert rows[f"{e} p1_dy"][0] == rows[f"{e} p3_x"][0] > 0
        assert rows[f"{e} p2_w1"][0] == 64 * 2 * 64
    assert sum(rows[f"{e} p1_dy"][0] for e in range(4)) == 64 * 2 * 64  # T * topk tokens of H values
    grads = []
    for i, seed in enumerate(("5", "5", "6")):
        out = str(tmp_path / f"g{i}.safetensors")
        a = run("moe-bwd", *SMALL, "--stochastic-rounding", "gradients", "--rounding-seed", seed, "--output", out)
        assert a.returncode == 0, a.stdout + a.stderr
        grads.append(mxfp8.load(out)["gate_up_proj_weight_grad"].view(np.uint16))
    assert np.array_equal(grads[0], grads[1]) and not np.array_equal(grads[0], grads[2])
    for bad in (("--stochastic-rounding", "p1_dy,nope"), ("--swiglu-limit", "abc"), ("--rounding-seed", "-3")):
        r = run("moe-bwd", *SMALL, *bad)
        assert r.returncode == 2 and "error" in r.stderr, bad


def test_moe_bwd_stochastic_rounding_says_there_is_no_verdict():
    r = run("moe-bwd", *SMALL, "--stochastic-rounding", "gemm1_x")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verdict: none -- with stochastic rounding there is no reference" in r.stdout
    assert "verdict: PASS" not in r.stdout and "verdict: FAIL" not in r.stdout
