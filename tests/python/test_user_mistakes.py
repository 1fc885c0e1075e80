"""Mistakes a new user makes with the numpy API and the CLI, each answered by a clear error naming the parameter (or
option) before any work: an axis out of range is never wrapped round, codes of another shape than the input are
said in the caller's names, a clamp_limits that is not a ClampLimits (a tuple) is never silently taken as "no
limits", and the gpt-oss SwiGLU options are checked as options, before the problem is built."""

import os
import subprocess

import numpy as np
import pytest

import mxfp8
from build_paths import CLI, require


def run(*args):
    return subprocess.run([require(CLI), *args], capture_output=True, text=True, timeout=300)


@pytest.fixture
def x(rng):
    return rng.standard_normal((8, 64)).astype(np.float32)


def test_quantize_profile_rejects_an_axis_out_of_range(x):
    # before: axis 5 of a 2-D array was taken modulo 2 (= axis 1) and quantized silently
    with pytest.raises(ValueError, match="axis: 5 is out of range for a 2-D array"):
        mxfp8.quantize_profile(x, axis=5)
    with pytest.raises(ValueError, match="x: needs an array of rank >= 1"):  # before: ZeroDivisionError
        mxfp8.quantize_profile(np.float32(1.0))
    # a valid negative axis still means what it means for mxfp8.quantize (the profile's defaults are its bits)
    d, s = mxfp8.quantize_profile(x, axis=-2)
    d0, s0 = mxfp8.quantize(x, axis=0)
    assert s.shape == (1, 64) and np.array_equal(d.view(np.uint8), d0.view(np.uint8))
    assert np.array_equal(s.view(np.uint8), s0.view(np.uint8))


def test_diff_names_the_callers_arrays_when_the_codes_do_not_fit(x):
    d, s = mxfp8.quantize(x)
    with pytest.raises(ValueError, match=r"data: the codes must have x's shape \(4, 64\), got \(8, 64\)"):
        mxfp8.diff(x[:4], d, s)  # before: the library's "src and data have different shapes"


def test_moe_config_clamp_limits_must_be_a_clamp_limits(rng):
    T, H, I, E, K, B = 32, 64, 32, 4, 2, 16
    hs = rng.uniform(0, 1, (T, H)).astype(np.float32)
    w1 = rng.uniform(-0.1, 0.1, (E, H, 2, I)).astype(np.float32)
    w2 = rng.uniform(-0.1, 0.1, (E, I, H)).astype(np.float32)
    ids = np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int32)
    p2i, b2e, aff = mxfp8.route(ids, rng.uniform(0, 1, (T, K)).astype(np.float32), num_experts=E, block_size=B)

    def fwd(cl):
        cfg = mxfp8.MXFP8MOEBwdConfig(clamp_limits=cl)
        return mxfp8.blockwise_mm_fwd_mxfp8(hs, aff, w1, w2, p2i, b2e, block_size=B, config=cfg)[0]

    for bad in ((0.01, 0.02), "0.01,0.02"):  # before: AttributeError "'tuple' object has no attribute ..."
        with pytest.raises(TypeError, match="config.clamp_limits: expected an mxfp8.ClampLimits, a dict of its "
                                            "fields or None"):
            fwd(bad)
    with pytest.raises(ValueError, match=r"config.clamp_limits: unknown field\(s\) \['upper'\]"):
        fwd({"upper": 0.01})
    # a dict of the fields is the ClampLimits of those fields (as mxfp8.torch takes it), and the clamp acts
    lim = dict(linear_clamp_upper_limit=0.01, non_linear_clamp_lower_limit=-0.02)
    clamped = fwd(mxfp8.ClampLimits(**lim))
    assert np.array_equal(fwd(lim).view(np.uint32), clamped.view(np.uint32))
    assert not np.array_equal(fwd(None).view(np.uint32), clamped.view(np.uint32))


SMALL = ("--H", "64", "--T", "64", "--E", "4", "--B", "16", "--topk", "2", "--I", "32", "--quiet")


@pytest.mark.parametrize("opts, message", [
    (("--activation", "gpt_oss_swiglu", "--swiglu-limit", "-1"),
     "--swiglu-limit must be > 0 (inf: no limit), got '-1'"),
    (("--activation", "gpt_oss_swiglu", "--swiglu-limit", "nan"), "--swiglu-limit must be > 0"),
    (("--activation", "gpt_oss_swiglu", "--swiglu-alpha", "inf"), "--swiglu-alpha must be finite, got 'inf'"),
    (("--swiglu-limit", "5"), "--swiglu-limit applies only to --activation gpt_oss_swiglu (the activation is silu)"),
    (("--activation", "swish", "--swiglu-alpha", "1.5"), "--swiglu-alpha applies only to --activation gpt_oss_swiglu"),
])
def test_moe_bwd_checks_the_swiglu_options_before_any_work(tmp_path, opts, message):
    out = tmp_path / "g.safetensors"
    r = run("moe-bwd", *SMALL, *opts, "--output", str(out))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip() == f"mxfp8 moe-bwd: error: {message}" or r.stderr.startswith(
        f"mxfp8 moe-bwd: error: {message}"), r.stderr
    assert r.stdout == "" and not out.exists()  # before: the header printed, the problem built, then the library's
    # "mxfp8_moe_forward failed: ... config.swiglu_limit" (or, without gpt_oss_swiglu, the option silently ignored)


def test_moe_bwd_gpt_oss_swiglu_without_a_limit_still_runs():
    r = run("moe-bwd", *SMALL, "--activation", "gpt_oss_swiglu", "--swiglu-limit", "inf")
    assert r.returncode == 0 and "verdict: PASS" in r.stdout, r.stdout + r.stderr


def test_cli_diff_names_the_files_when_the_shapes_differ(tmp_path, rng):
    x = rng.standard_normal((8, 64)).astype(np.float32)
    q = str(tmp_path / "q.safetensors")
    np.save(str(tmp_path / "x.npy"), x)
    np.save(str(tmp_path / "x3.npy"), rng.standard_normal((2, 3, 64)).astype(np.float32))
    assert run("quantize", str(tmp_path / "x.npy"), "-o", q).returncode == 0
    r = run("diff", str(tmp_path / "x3.npy"), q)
    assert r.returncode == 2
    assert r.stderr == (f"mxfp8 diff: error: {q}: 'data' [8, 64] does not have the shape of INPUT "
                        f"{tmp_path / 'x3.npy'} 'x3' [2, 3, 64] (the codes of every element)\n"), r.stderr
    ok = run("diff", str(tmp_path / "x.npy"), q)
    assert ok.returncode == 0 and "bitwise equal" in ok.stdout, ok.stdout + ok.stderr


def test_moe_bwd_block_size_contradicting_a_bundles_routing_is_a_usage_error(tmp_path):
    bundle, out = tmp_path / "bundle.safetensors", tmp_path / "g.safetensors"
    r = run("moe-bwd", *SMALL, "--save-inputs", str(bundle), "--no-check")  # explicit routing, B = 16
    assert r.returncode == 0, r.stdout + r.stderr
    r = run("moe-bwd", "--inputs", str(bundle), "--block-size", "32", "--output", str(out), "--quiet")
    assert r.returncode == 2 and r.stdout == "" and not out.exists(), r.stdout + r.stderr
    # before: the header printed, then "mxfp8_moe_backward failed: ... not a multiple of block_size 32"
    n = mxfp8.load(str(bundle))["block_to_expert"].shape[0]
    assert r.stderr == (f"mxfp8 moe-bwd: error: {bundle}: --block-size 32 contradicts the bundle's routing: "
                        f"token_position_to_id has {16 * n} positions for block_to_expert's {n} blocks, block size 16 "
                        "(leave --block-size out)\n"), r.stderr
    for same in (("--block-size", "16"), ()):  # the bundle's own block size, given or not, runs
        r = run("moe-bwd", "--inputs", str(bundle), *same, "--quiet")
        assert r.returncode == 0 and "verdict: PASS" in r.stdout, r.stdout + r.stderr


def test_save_into_a_missing_directory_names_the_callers_path(tmp_path):
    path = tmp_path / "no_such_dir" / "x.safetensors"
    with pytest.raises(FileNotFoundError, match=f"{path}: cannot write: the directory {path.parent} does not exist"):
        mxfp8.save(str(path), {"a": np.zeros(3, np.float32)})  # before: named '.x.safetensors.<pid>.<hex>.tmp'
    assert not path.parent.exists()


def test_an_output_that_is_the_input_file_is_refused(tmp_path):
    """quantize / dequantize / matmul-bwd / moe-bwd refuse an output path naming their input file (through another
    spelling too), before any work: the input is left as it was."""
    x = tmp_path / "x.npy"
    np.save(x, np.linspace(-2, 2, 4 * 64, dtype=np.float32).reshape(4, 64))
    q = tmp_path / "q.safetensors"
    assert run("quantize", str(x), "-o", str(q), "--quiet").returncode == 0
    before = q.read_bytes()
    other_spelling = str(tmp_path / "." / "q.safetensors")
    for args in (("dequantize", str(q), "-o", other_spelling), ("quantize", str(q), "-o", str(q)),
                 ("matmul-bwd", "--inputs", str(q), "--output", other_spelling),
                 ("moe-bwd", "--inputs", str(q), "--output", other_spelling)):
        r = run(*args)
        assert r.returncode == 2 and "is the input file" in r.stderr, (args, r.stderr)
    assert q.read_bytes() == before
