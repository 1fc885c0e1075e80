"""Finite values near FLT_MAX (include/mxfp8.h, "Values near FLT_MAX"): for each scale rule and format, F32 and
bfloat16 inputs, mxfp8.quantize against mx_oracle (which steps a code down until its dequantized value is finite),
the dequantize round trip stays finite, and `mxfp8 quantize --stats` counts the clamped elements as saturated."""
import os
import subprocess

import ml_dtypes
import numpy as np
import pytest

import mxfp8
import mx_oracle
from test_numerics import stats_oracle

FMTS = ("e4m3", "e5m2")
RULES = ("nki", "ocp", "rceil")
FLT_MAX = float(np.finfo(np.float32).max)


def near_max(fmt, dtype):
    rng = np.random.default_rng(11)
    x = (rng.uniform(1.0, 2.0, (8, 512)) * 2.0**127).astype(np.float32)
    x = np.where(np.isfinite(x), x, np.float32(FLT_MAX)) * np.where(rng.random(x.shape) < 0.5, -1, 1).astype(np.float32)
    edge = [248 * 2.0**120, 240 * 2.0**120, FLT_MAX] if fmt == "e4m3" else [30720 * 2.0**113, 28672 * 2.0**113, FLT_MAX]
    x[0, :3] = edge
    x[1, :32] = rng.standard_normal(32).astype(np.float32)  # an ordinary group beside them
    if dtype == "bfloat16":  # truncate, so that FLT_MAX stays finite
        x = (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32).astype(ml_dtypes.bfloat16)
    return x


@pytest.mark.parametrize("dtype", ("float32", "bfloat16"))
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("fmt", FMTS)
def test_near_flt_max(fmt, rule, dtype):
    x = near_max(fmt, dtype)
    x32 = np.asarray(x, np.float32)
    d, s, st = mxfp8.quantize(x, fmt, axis=1, scale_rule=rule, stats=True)
    codes, scales = mx_oracle.quantize(x32, fmt, 1, rule, "1x32")
    assert np.array_equal(s, scales)
    assert np.array_equal(d.view(np.uint8), codes)
    d2, s2 = mxfp8.quantize(x, fmt, axis=1, scale_rule=rule)  # the path without statistics
    assert np.array_equal(d2.view(np.uint8), codes) and np.array_equal(s2, scales)
    v = mxfp8.dequantize(d, s, axis=1, fmt=fmt)
    assert np.all(np.isfinite(v)), "a finite input dequantized to a non-finite value"
    assert st["saturated"] == stats_oracle(x32, fmt, 1, rule)["saturated"]
    if rule != "ocp":
        assert st["saturated"] > 0
    # stochastic rounding stays finite too
    for seed in (1, 2, 3):
        d3, s3 = mxfp8.quantize(x, fmt, axis=1, scale_rule=rule, rounding="stochastic", seed=seed)
        assert np.all(np.isfinite(mxfp8.dequantize(d3, s3, axis=1, fmt=fmt)))


def test_cli_stats_counts_clamped(tmp_path):
    x = near_max("e4m3", "float32")
    np.save(tmp_path / "x.npy", x)
    exe = os.path.join(os.environ.get("MXFP8_BUILD_DIR", "build"), "mxfp8")
    r = subprocess.run([exe, "quantize", str(tmp_path / "x.npy"), "-o", str(tmp_path / "q.safetensors"), "--stats"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    want = stats_oracle(x, "e4m3", -1, "nki")["saturated"]
    assert want > 0 and f"{want} saturated" in r.stdout + r.stderr
