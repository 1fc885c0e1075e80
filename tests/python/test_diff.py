"""mxfp8.diff and `mxfp8 diff` on the examples shipped in tests/data (made by tests/data/make_diff_examples.py with
our own quantizer plus one documented non-standard policy each): every example is classified into its class, with
the base profile found; the result of one of our profiles is reported "bitwise equal" (exit 0). Also: the profiles'
quantizer against mxfp8.quantize and against the policies it names, written here in numpy."""

import os
import subprocess

import ml_dtypes
import numpy as np
import pytest

import mxfp8
from build_paths import CLI, REPO, require

DATA = os.path.join(REPO, "tests", "data")
CLASSES = ("tiny", "pow2", "nonfinite", "saturation", "subnormal", "zero-sign", "rounding")


def load(name):
    x = mxfp8.load(os.path.join(DATA, f"diff_{name}_input.safetensors"))["x"]
    o = mxfp8.load(os.path.join(DATA, f"diff_{name}_other.safetensors"))
    return x, o["data"], o["scales"]


@pytest.mark.parametrize("name", CLASSES)
def test_each_example_is_classified(name):
    x, d, s = load(name)
    r = mxfp8.diff(x, d, s)
    assert not r["bitwise_equal"]
    assert r["profile"]["scale_rule"] == ("rceil" if name == "pow2" else "ocp")
    counts = {c: v["count"] for c, v in r["unexplained"].items() if v["count"]}
    assert counts == {name: 3}, counts
    assert r["unexplained"][name]["examples"] == [(1, 1), (4, 4), (6, 6)]  # the groups the policy changed
    assert r["matched"] == r["groups"] - 3 == 61


def test_identical_is_bitwise_equal():
    x, d, s = load("bitwise")
    r = mxfp8.diff(x, d, s)
    assert r["bitwise_equal"] and r["matched"] == r["groups"] and r["profile"]["scale_rule"] == "ocp"
    for rule in ("nki", "rceil"):  # any of our results is explained by its own profile
        d2, s2 = mxfp8.quantize(x, "e4m3", axis=1, scale_rule=rule)
        r2 = mxfp8.diff(x, d2, s2)
        assert r2["bitwise_equal"] and r2["profile"]["scale_rule"] == rule


def run_cli(*args):
    return subprocess.run([require(CLI), "diff", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", CLASSES + ("bitwise",))
def test_cli(name):
    r = run_cli(os.path.join(DATA, f"diff_{name}_input.safetensors"),
                os.path.join(DATA, f"diff_{name}_other.safetensors"))
    lines = r.stdout.splitlines()
    prof = [ln for ln in lines if ln.startswith("profile:")]
    assert len(prof) == 1 and prof[0].split()[1] == ("rceil" if name == "pow2" else "ocp"), r.stdout
    if name == "bitwise":
        assert r.returncode == 0 and "bitwise equal" in r.stdout
        return
    assert r.returncode == 1, r.stdout + r.stderr
    classes = [ln.split(":")[0].strip() for ln in lines if ln.startswith("  ") and ": " in ln and "group" in ln
               and not ln.startswith("    ")]
    assert classes == [name], r.stdout
    assert "bitwise equal" not in r.stdout


def test_cli_bad_usage():
    r = run_cli(os.path.join(DATA, "diff_tiny_input.safetensors"))
    assert r.returncode == 2 and "error" in r.stderr
    r = run_cli(os.path.join(DATA, "diff_tiny_input.safetensors"), os.path.join(DATA, "diff_tiny_input.safetensors"))
    assert r.returncode == 2 and "'data' and 'scales'" in r.stderr


# ---- the profiles' quantizer, against numpy versions of the policies ----
def test_default_profile_is_quantize(rng):
    x = (rng.standard_normal((16, 200)) * np.exp2(rng.integers(-20, 20, (16, 1)))).astype(np.float32)
    x[2, 3] = np.nan
    for fmt in ("e4m3", "e5m2"):
        for rule in ("nki", "ocp", "rceil"):
            d, s = mxfp8.quantize(x, fmt, axis=0, scale_rule=rule)
            dp, sp = mxfp8.quantize_profile(x, fmt, axis=0, scale_rule=rule)
            assert np.array_equal(d.view(np.uint8), dp.view(np.uint8)) and np.array_equal(s, sp)


def test_profile_policies(rng):
    x = rng.standard_normal((4, 64)).astype(np.float32) * 3
    x[0, 0] = 1.99 * 2 ** np.ceil(np.log2(np.abs(x[0, :32]).max()))  # saturates under OCP
    x[1, 1], x[2, 2] = np.inf, np.nan
    x[3, 4] = -1e-30
    d, s = mxfp8.quantize(x, "e4m3", scale_rule="ocp")
    c = d.view(np.uint8)
    # no saturation: the saturated element becomes NaN, nothing else changes
    dn, sn = mxfp8.quantize_profile(x, "e4m3", scale_rule="ocp", saturation="none")
    cn = dn.view(np.uint8)
    assert np.array_equal(sn, s) and cn[0, 0] == 0x7F and c[0, 0] == 0x7E
    assert np.array_equal(np.delete(cn.ravel(), 0), np.delete(c.ravel(), 0))
    # unsigned zeros: the flushed negative value is +0
    du, _ = mxfp8.quantize_profile(x, "e4m3", scale_rule="ocp", zero="unsigned")
    assert c[3, 4] == 0x80 and du.view(np.uint8)[3, 4] == 0x00
    # NaN / Inf per element: the other elements of those groups are quantized with the finite amax
    de, se = mxfp8.quantize_profile(x, "e4m3", scale_rule="ocp", nonfinite="per_element")
    ce = de.view(np.uint8)
    assert s[1, 0] == 255 and se[1, 0] != 255 and ce[1, 1] == 0x7F and ce[2, 2] & 0x7F == 0x7F
    finite = np.delete(x[1, :32], 1)
    e = int(se[1, 0]) - 127
    want = np.clip(finite.astype(np.float64) * 2.0 ** -e, -448, 448).astype(np.float32).astype(
        ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert np.array_equal(np.delete(ce[1, :32], 1), want)
    # rounding toward zero: never above |x| / 2^e
    dz, sz = mxfp8.quantize_profile(x, "e4m3", scale_rule="ocp", rounding="toward_zero")
    vz = dz.astype(np.float64) * np.repeat(2.0 ** (sz.astype(int) - 127), 32, axis=1)
    ok = np.isfinite(x) & (np.repeat(sz, 32, axis=1) != 255)
    assert np.all(np.abs(vz[ok]) <= np.abs(x[ok]))
