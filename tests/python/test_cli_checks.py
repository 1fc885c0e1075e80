"""Tests of the CLI's judgement and messages: the verdicts of matmul-bwd / moe-bwd (against the quantized FP64
reference; the NKI criteria as information), the test hook that corrupts a kernel result, the progress line on a
terminal, bundles with unknown tensor names, file types detected by content, the common error format of every
command (bench included), and `quantize --stats` against the independent oracle (mx_oracle.py).
"""

import os
import pty
import re
import subprocess
import threading

import numpy as np
import pytest

import mx_oracle
from test_cli import CLI, BF16, assert_clean_error, run, st_load, st_save

pytestmark = pytest.mark.skipif(not os.path.isfile(CLI), reason=f"the mxfp8 CLI is not built ({CLI})")

CLAMP_CASE = ["--H", "256", "--T", "256", "--I", "128", "--E", "4", "--B", "64", "--topk", "2",
              "--up-clamp", "-0.5,0.5", "--gate-clamp", ",0.5"]


def run_env(env, *args):
    e = dict(os.environ)
    e.update(env)
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=600, env=e)


def verdict_rows(stdout):
    """{gradient: 'PASS'|'FAIL'} of the verdict's table."""
    table = stdout.split("the kernel against the quantized FP64 reference")[1].split("allowed:")[0]
    rows = {}
    for line in table.strip().splitlines()[2:]:
        if line.startswith(" "):  # a note under a row (non-finite elements)
            continue
        f = line.split()
        rows[f[0]] = f[-1]
    return rows


# ---------------------------------------------------------------------------------------------------------------
# verdicts
# ---------------------------------------------------------------------------------------------------------------
def test_clamp_case_passes():
    """The clamp case: quantization flips clamp masks relative to the unquantized golden, so two gradients miss the
    NKI cosine criterion -- as the quantized FP64 reference itself does. The kernel is right: PASS, exit 0."""
    r = run("moe-bwd", *CLAMP_CASE, "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verdict: PASS" in r.stdout
    assert set(verdict_rows(r.stdout).values()) == {"PASS"}
    nki = r.stdout.split("NKI pass criteria against the unquantized FP64 golden")[1]
    assert "FAIL" in nki, "this case is meant to miss an NKI criterion (else the test shows nothing)"
    assert "not met by" in r.stdout and "not of the kernel" in r.stdout


@pytest.mark.parametrize("grad", ["gate_up_proj_weight_grad", "hidden_states_grad", "down_proj_weight_grad",
                                  "expert_affinities_masked_grad"])
def test_corrupted_moe_result_fails(tmp_path, grad):
    r = run_env({"MXFP8_CLI_TEST_CORRUPT": grad}, "moe-bwd", *CLAMP_CASE, "--quiet", "--output",
                tmp_path / "g.safetensors")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "verdict: FAIL" in r.stdout and grad in r.stdout.split("verdict: FAIL")[1]
    rows = verdict_rows(r.stdout)
    assert rows[grad] == "FAIL" and all(v == "PASS" for k, v in rows.items() if k != grad), rows
    assert f"corrupted {grad}" in r.stderr


@pytest.mark.parametrize("grad", ["input_grad", "weight_grad"])
def test_corrupted_matmul_result_fails(grad):
    args = ["matmul-bwd", "--M", "64", "--N", "96", "--K", "128", "--repeat", "1"]
    assert run(*args).returncode == 0
    r = run_env({"MXFP8_CLI_TEST_CORRUPT": grad}, *args)
    assert r.returncode == 1 and "verdict: FAIL" in r.stdout, r.stdout
    assert verdict_rows(r.stdout)[grad] == "FAIL"
    r = run_env({"MXFP8_CLI_TEST_CORRUPT": "no_such_gradient"}, *args)
    assert r.returncode == 0 and "verdict: PASS" in r.stdout and not r.stderr


@pytest.mark.parametrize("extra", [[], ["--output-dtype", "f32"], ["--output-dtype", "f16", "--float8-dtype",
                                                                     "float8_e4m3fn", "--scale-rule", "ocp"]])
def test_matmul_verdict_within_the_fp32_bound(extra):
    """The kernel stays within the stated bound (worst / allowed <= 1) for every output dtype."""
    r = run("matmul-bwd", "--M", "96", "--N", "160", "--K", "72", "--repeat", "1", *extra, check_rc=0)
    table = r.stdout.split("the kernel against the quantized FP64 reference")[1].split("allowed:")[0]
    for line in table.strip().splitlines()[2:]:
        if line.startswith(" "):
            continue
        ratio = float(line.split()[-2])
        assert 0 <= ratio <= 1, line
    assert "gamma_n = n 2^-24" in r.stdout


# ---------------------------------------------------------------------------------------------------------------
# progress
# ---------------------------------------------------------------------------------------------------------------
def run_on_terminal(*args):
    """Run with stderr on a pseudo-terminal; returns (returncode, stdout, what the terminal received)."""
    master, slave = pty.openpty()
    p = subprocess.Popen([CLI, *map(str, args)], stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    got = []

    def reader():
        while True:
            try:
                b = os.read(master, 4096)
            except OSError:
                return
            if not b:
                return
            got.append(b)

    t = threading.Thread(target=reader)
    t.start()
    out = p.stdout.read()
    p.wait(timeout=600)
    t.join(timeout=10)
    os.close(master)
    return p.returncode, out.decode(), b"".join(got).decode(errors="replace")


@pytest.mark.parametrize("cmd", [["matmul-bwd", "--M", "128", "--N", "128", "--K", "128"],
                                 ["moe-bwd", "--H", "64", "--T", "48", "--E", "3", "--B", "16", "--topk", "2",
                                  "--I", "32"]])
def test_progress_line_on_a_terminal(cmd):
    rc, out, term = run_on_terminal(*cmd)
    assert rc == 0 and "verdict: PASS" in out
    assert re.search(r"mxfp8 [a-z-]+: \[ *\d+%\] .+ \(step \d+ of \d+\), .+ elapsed, about .+ left", term), term
    assert "golden reference" in term and "--no-check skips" in term
    assert term.rstrip(" \r\n").endswith("\x1b[K"), repr(term[-80:])  # the line is erased at the end
    rc, out, term = run_on_terminal(*cmd, "--quiet")
    assert rc == 0 and term == "", repr(term)
    r = run(*cmd, check_rc=0)  # not a terminal: no progress
    assert r.stderr == ""


# ---------------------------------------------------------------------------------------------------------------
# input errors
# ---------------------------------------------------------------------------------------------------------------
def _bf16(rng, shape):
    return rng.standard_normal(shape).astype(np.float32).astype(BF16)


def test_unknown_bundle_names_are_errors(tmp_path, rng):
    good = {"output_grad": _bf16(rng, (8, 32)), "weights": _bf16(rng, (32, 16)),
            "input_activation": _bf16(rng, (8, 16))}
    st_save(tmp_path / "b.safetensors", {**good, "weight": _bf16(rng, (32, 16))})
    r = run("matmul-bwd", "--inputs", tmp_path / "b.safetensors")
    assert_clean_error(r, "matmul-bwd", tmp_path, ["b.safetensors"])
    assert "'weight'" in r.stderr and "output_grad, weights, input_activation" in r.stderr
    T, H, I, E = 16, 32, 32, 2
    moe = {"hidden_states": _bf16(rng, (T, H)), "gate_up_proj_weight": _bf16(rng, (E, H, 2, I)),
           "down_proj_weight": _bf16(rng, (E, I, H)), "output_hidden_states_grad": _bf16(rng, (T, H)),
           "topk_ids": np.stack([rng.permutation(E)[:1] for _ in range(T)]).astype(np.int32),
           "topk_weights": rng.uniform(0, 1, (T, 1)).astype(np.float32)}
    st_save(tmp_path / "m.safetensors", moe)
    run("moe-bwd", "--inputs", tmp_path / "m.safetensors", "--block-size", "8", "--no-check", check_rc=0)
    st_save(tmp_path / "m.safetensors", {**moe, "gate_up_proj_checkpoint": np.zeros(4, np.float32)})
    r = run("moe-bwd", "--inputs", tmp_path / "m.safetensors", "--block-size", "8")
    assert_clean_error(r, "moe-bwd", tmp_path, ["b.safetensors", "m.safetensors"])
    assert "'gate_up_proj_checkpoint'" in r.stderr and "gate_up_proj_act_checkpoint_T" in r.stderr


def test_file_type_by_content(tmp_path, rng):
    x = rng.standard_normal((3, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    os.rename(tmp_path / "x.npy", tmp_path / "x.txt")
    run("quantize", tmp_path / "x.txt", "-o", tmp_path / "q.safetensors", check_rc=0)
    codes, scales = mx_oracle.quantize(x, fmt="e4m3", axis=-1)
    q = st_load(tmp_path / "q.safetensors")
    np.testing.assert_array_equal(q["data"].view(np.uint8), codes)
    np.testing.assert_array_equal(q["scales"], scales)
    st_save(tmp_path / "s.npy", {"t": x})  # a safetensors file named .npy
    run("quantize", tmp_path / "s.npy", "-o", tmp_path / "q2.safetensors", check_rc=0)
    np.testing.assert_array_equal(st_load(tmp_path / "q2.safetensors")["data"].view(np.uint8), codes)
    (tmp_path / "notes.txt").write_text("hello, this is not a tensor\n" * 20)
    r = run("quantize", tmp_path / "notes.txt", "-o", tmp_path / "q3.safetensors")
    assert_clean_error(r, "quantize", tmp_path, ["x.txt", "q.safetensors", "s.npy", "q2.safetensors", "notes.txt"])
    assert "not a tensor file" in r.stderr and "100 MB" not in r.stderr


@pytest.mark.parametrize("args", [["--bogus"], ["nosuchsection"], ["--reps", "0"], ["--threads", "x"],
                                  ["--plot", "out.txt"]])
def test_bench_errors_use_the_common_format(tmp_path, args):
    r = subprocess.run([CLI, "bench", *args], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert_clean_error(r, "bench", tmp_path, [])


# ---------------------------------------------------------------------------------------------------------------
# quantize --stats
# ---------------------------------------------------------------------------------------------------------------
def _stats_numbers(stdout):
    nums = {}
    m = re.search(r"scale exponents \(E8M0 code - 127\): (-?\d+) \.\. (-?\d+)", stdout)
    nums["emin"], nums["emax"] = int(m.group(1)), int(m.group(2))
    m = re.search(r"(\d+) saturated .*, (\d+) flushed to zero, (\d+) FP8 subnormals", stdout)
    nums["saturated"], nums["flushed"], nums["subnormal"] = map(int, m.groups())
    nums["sqnr"] = float(re.search(r"SQNR (-?[\d.]+) dB", stdout).group(1))
    nums["nan_groups"] = int(re.search(r"(\d+) groups hold NaN/Inf", stdout).group(1))
    m = re.search(r"median ([\d.e+-]+), 99th percentile ([\d.e+-]+), max ([\d.e+-]+)", stdout)
    nums["median"], nums["p99"], nums["max"] = map(float, m.groups())
    return nums


@pytest.mark.parametrize("fmt,rule", [("e4m3", "nki"), ("e4m3", "ocp"), ("e5m2", "rceil"), ("e5m2", "ocp")])
def test_quantize_stats_match_the_oracle(tmp_path, rng, fmt, rule):
    x = (rng.standard_normal((40, 96)) * np.exp2(rng.integers(-12, 12, (40, 1)))).astype(np.float32)
    x[rng.random(x.shape) < 0.02] = 0
    x[3, 5] = 1e-30  # flushed to zero
    x[7, 40] = np.nan  # one NaN group
    np.save(tmp_path / "x.npy", x)
    r = run("quantize", tmp_path / "x.npy", "-o", tmp_path / "q.safetensors", "--fmt", fmt, "--scale-rule", rule,
            "--stats", check_rc=0)
    got = _stats_numbers(r.stdout)
    codes, scales = mx_oracle.quantize(x, fmt=fmt, axis=1, rule=rule)
    xh = mx_oracle.dequantize(codes, scales, fmt=fmt, axis=1).astype(np.float64)
    group_nan = np.repeat(scales == 255, 32, axis=1)[:, :x.shape[1]]
    fin = ~group_nan
    xd = x.astype(np.float64)
    maxnorm = 448.0 if fmt == "e4m3" else 57344.0
    scale_val = np.repeat(np.exp2(scales.astype(np.float64) - 127), 32, axis=1)[:, :x.shape[1]]
    mant_bits = 3 if fmt == "e4m3" else 2
    exp_field = (codes & 0x7F) >> mant_bits
    assert got["nan_groups"] == int((scales == 255).sum()) == 1
    assert got["saturated"] == int((fin & (np.abs(xd) > maxnorm * scale_val)).sum())
    assert got["flushed"] == int((fin & (xd != 0) & (xh == 0)).sum()) >= 1
    assert got["subnormal"] == int((fin & (exp_field == 0) & ((codes & ((1 << mant_bits) - 1)) != 0)).sum())
    finite_codes = scales[scales != 255].astype(int)
    assert (got["emin"], got["emax"]) == (finite_codes.min() - 127, finite_codes.max() - 127)
    sqnr = 10 * np.log10((xd[fin] ** 2).sum() / ((xd[fin] - xh[fin]) ** 2).sum())
    assert abs(got["sqnr"] - sqnr) < 0.006
    rel = []
    for i in range(x.shape[0]):
        for g in range(scales.shape[1]):
            if scales[i, g] == 255:
                continue
            a, b = xd[i, 32 * g:32 * g + 32], xh[i, 32 * g:32 * g + 32]
            if (a ** 2).sum() > 0:
                rel.append(np.sqrt(((a - b) ** 2).sum() / (a ** 2).sum()))
    rel = np.sort(rel)
    assert got["max"] == pytest.approx(rel[-1], rel=1e-3)
    assert got["median"] == pytest.approx(rel[len(rel) // 2], rel=1e-3)
    if rule == "ocp" and fmt == "e4m3":
        assert got["saturated"] > 0, "the OCP rule saturates: the test data must show it"


def test_quantize_plot(tmp_path, rng):
    import matplotlib  # noqa: F401  (scripts/setup.sh --test installs it; its absence fails here)
    x = rng.standard_normal((16, 256)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = run_env({"MXFP8_PYTHON": os.environ.get("MXFP8_PYTHON", "") or __import__("sys").executable},
                "quantize", tmp_path / "x.npy", "-o", tmp_path / "q.safetensors", "--plot", tmp_path / "s.png")
    assert r.returncode == 0, r.stderr
    assert "SQNR" in r.stdout and (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(os.listdir(tmp_path)) == ["q.safetensors", "s.png", "x.npy"]


def test_plot_without_matplotlib(tmp_path, rng):
    """A Python without matplotlib: one clear error line, exit 2, and no output file (neither image nor data)."""
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "matplotlib.py").write_text("raise ImportError('matplotlib is not here')\n")
    shim = tmp_path / "python"
    shim.write_text(f"#!/bin/sh\nPYTHONPATH={fake} exec {__import__('sys').executable} \"$@\"\n")
    shim.chmod(0o755)
    np.save(tmp_path / "x.npy", rng.standard_normal((2, 64)).astype(np.float32))
    r = run_env({"MXFP8_PYTHON": str(shim)}, "quantize", tmp_path / "x.npy", "-o", tmp_path / "q.safetensors",
                "--plot", tmp_path / "s.png")
    assert_clean_error(r, "quantize", tmp_path, ["fake", "python", "x.npy"])
    assert "matplotlib" in r.stderr


# ---------------------------------------------------------------------------------------------------------------
# verdicts of bundles that carry checkpoints: the reference takes what the kernel took
# ---------------------------------------------------------------------------------------------------------------
CK_CASE = ["--H", "128", "--T", "128", "--I", "64", "--E", "4", "--B", "32", "--topk", "2"]
CK_DTYPES = {"f32": np.float32, "bf16": BF16, "f16": np.float16}


def _unquantized_checkpoints(t, on_h):
    """Every checkpoint of the bundle's layer (SiLU, no bias) from the unquantized forward in FP64, as another stack
    would hand them over: g, u = X W1 (no MXFP8), act = g sigmoid(g), inter = act u, the scaled intermediate a inter,
    D = a dY (AFFINITY_ON_H) and the down projection inter W2. Layouts of the NKI page: [N, 2, I, B], [N, I, B],
    [N, B, H]; padding positions 0."""
    x = t["hidden_states"].astype(np.float64)
    w1 = t["gate_up_proj_weight"].astype(np.float64)
    w2 = t["down_proj_weight"].astype(np.float64)
    dy = t["output_hidden_states_grad"].astype(np.float64)
    aff = t["expert_affinities_masked"].astype(np.float64).reshape(-1)
    b2e = t["block_to_expert"].reshape(-1)
    T, H = x.shape
    E, _, _, I = w1.shape
    N = b2e.size
    B = t["token_position_to_id"].size // N
    tok = t["token_position_to_id"].reshape(N, B)
    gu = np.zeros((N, 2, I, B))
    act, inter, s = (np.zeros((N, I, B)) for _ in range(3))
    d, down = np.zeros((N, B, H)), np.zeros((N, B, H))
    for n in range(N):
        e = b2e[n]
        for p in range(B):
            tk = tok[n, p]
            if tk < 0 or tk >= T:
                continue
            a = aff[tk * E + e]
            g, u = x[tk] @ w1[e][:, 0, :], x[tk] @ w1[e][:, 1, :]
            ac = g / (1.0 + np.exp(-g))
            gu[n, 0, :, p], gu[n, 1, :, p] = g, u
            act[n, :, p], inter[n, :, p], s[n, :, p] = ac, ac * u, a * ac * u
            d[n, p], down[n, p] = a * dy[tk], (ac * u) @ w2[e]
    ck = {"gate_up_proj_act_checkpoint_T": gu, "gate_act_checkpoint_T": act, "intermediate_checkpoint_T": inter}
    if on_h:
        ck.update(down_proj_act_checkpoint=d, down_proj_output_checkpoint=down)
    else:
        ck["scaled_intermediate_checkpoint_T"] = s
    return ck


@pytest.mark.parametrize("dtype", sorted(CK_DTYPES))
@pytest.mark.parametrize("which", ["gate_up", "all_on_i", "all_on_h"])
def test_bundle_checkpoints_judged_on_what_the_kernel_took(tmp_path, dtype, which):
    """A bundle with checkpoints from another forward (here the unquantized one, in each accepted dtype): the
    kernel uses them, so the quantized reference must too. The right answer judges PASS; the same run with one
    gradient perturbed after the kernel judges FAIL on that gradient."""
    on_h = which == "all_on_h"
    aff = ["--affinity", "on_h"] if on_h else []
    r = run("moe-bwd", *CK_CASE, *aff, "--quiet", "--no-check", "--save-inputs", tmp_path / "b.safetensors")
    assert r.returncode == 0, r.stdout + r.stderr
    t = st_load(tmp_path / "b.safetensors")
    ck = _unquantized_checkpoints(t, on_h)
    if which == "gate_up":
        ck = {"gate_up_proj_act_checkpoint_T": ck["gate_up_proj_act_checkpoint_T"]}
    t.update({k: v.astype(CK_DTYPES[dtype]) for k, v in ck.items()})
    st_save(tmp_path / "ck.safetensors", t)
    args = ["moe-bwd", "--inputs", tmp_path / "ck.safetensors", *aff, "--quiet", "--repeat", "1"]
    r = run(*args)
    assert r.returncode == 0 and "verdict: PASS" in r.stdout, r.stdout + r.stderr
    assert set(verdict_rows(r.stdout).values()) == {"PASS"}
    grad = "gate_up_proj_weight_grad"
    r = run_env({"MXFP8_CLI_TEST_CORRUPT": grad}, *args)
    assert r.returncode == 1 and "verdict: FAIL" in r.stdout, r.stdout + r.stderr
    rows = verdict_rows(r.stdout)
    assert rows[grad] == "FAIL" and all(v == "PASS" for k, v in rows.items() if k != grad), rows


def test_nan_inputs_verdict_says_where_the_nans_are(tmp_path):
    """A NaN in output_grad poisons its MX group (OCP: the scale becomes NaN): dY[3, 5] quantized along N spoils
    row 3 of input_grad (K = 64 values), quantized along M it spoils row 5 of weight_grad (64 values). The verdict
    says that the reference has those NaNs and that the kernel has them at the same places, and its error columns
    stay finite (over the finite elements)."""
    rng = np.random.default_rng(7)
    dy, w, x = (rng.standard_normal((64, 64)).astype(np.float32) for _ in range(3))
    dy[3, 5] = np.nan
    st_save(tmp_path / "nan.safetensors", {"output_grad": dy, "weights": w, "input_activation": x})
    r = run("matmul-bwd", "--inputs", tmp_path / "nan.safetensors", "--repeat", "1", "--quiet", "--output-dtype",
            "f32", "--output", tmp_path / "g.safetensors")
    assert r.returncode == 0 and "verdict: PASS" in r.stdout, r.stdout + r.stderr
    g = st_load(tmp_path / "g.safetensors")
    assert np.isnan(g["input_grad"][3]).all() and np.isnan(g["input_grad"]).sum() == 64
    assert np.isnan(g["weight_grad"][5]).all() and np.isnan(g["weight_grad"]).sum() == 64
    table = r.stdout.split("the kernel against the quantized FP64 reference")[1].split("allowed:")[0]
    assert table.count("64 NaN values in the reference; the kernel has NaN at the same places (they match)") == 2
    for line in table.strip().splitlines()[2:]:
        if not line.startswith(" "):
            assert "nan" not in line.split()[2:4], line
    # NaN where the reference has none: the verdict fails and says so
    r = run_env({"MXFP8_CLI_TEST_CORRUPT": "weight_grad"}, "matmul-bwd", "--inputs", tmp_path / "nan.safetensors",
                "--repeat", "1", "--quiet")
    assert r.returncode == 1 and verdict_rows(r.stdout)["weight_grad"] == "FAIL", r.stdout


def _shim_python(tmp_path, matplotlib_source):
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "matplotlib.py").write_text(matplotlib_source)
    shim = tmp_path / "python"
    shim.write_text(f"#!/bin/sh\nPYTHONPATH={fake} exec {__import__('sys').executable} \"$@\"\n")
    shim.chmod(0o755)
    return shim


def test_quantize_output_written_when_the_plot_fails(tmp_path, rng):
    """matplotlib is there (the check before the work passes) but drawing fails: the quantized tensors are still
    written, the error says why the plot is missing, exit 2."""
    shim = _shim_python(tmp_path, "def use(name):\n    raise ValueError('no backend here')\n")
    np.save(tmp_path / "x.npy", rng.standard_normal((2, 64)).astype(np.float32))
    r = run_env({"MXFP8_PYTHON": str(shim)}, "quantize", tmp_path / "x.npy", "-o", tmp_path / "q.safetensors",
                "--plot", tmp_path / "s.png")
    assert r.returncode == 2 and "drawing" in r.stderr and "no backend here" in r.stderr, r.stderr
    assert "q.safetensors was written; only the plot" in r.stderr
    assert (tmp_path / "q.safetensors").exists() and not (tmp_path / "s.png").exists()
    assert set(st_load(tmp_path / "q.safetensors")) == {"data", "scales"}


def test_bench_plot_checks_matplotlib_first(tmp_path):
    shim = _shim_python(tmp_path, "raise ImportError('matplotlib is not here')\n")
    r = run_env({"MXFP8_PYTHON": str(shim)}, "bench", "--plot", tmp_path / "b.png")
    assert r.returncode == 2 and "--plot needs matplotlib" in r.stderr and not r.stdout, r.stdout + r.stderr
    assert sorted(os.listdir(tmp_path)) == ["fake", "python"]


def test_plot_has_the_users_file_mode(tmp_path, rng):
    pytest.importorskip("matplotlib")
    np.save(tmp_path / "x.npy", rng.standard_normal((2, 64)).astype(np.float32))
    old = os.umask(0o022)
    try:
        r = run_env({"MXFP8_PYTHON": __import__("sys").executable}, "quantize", tmp_path / "x.npy", "-o",
                    tmp_path / "q.safetensors", "--plot", tmp_path / "s.png")
    finally:
        os.umask(old)
    assert r.returncode == 0, r.stderr
    assert (os.stat(tmp_path / "s.png").st_mode & 0o777) == 0o644
