"""Tests of `mxfp8 bench`: what it reports and how (the JSON keys and rows, the same-run ratios, the medians, the
plot), never how fast anything is. One `--quick --reps 1` run serves the JSON tests."""

import json
import os
import subprocess
import sys

import pytest

from test_cli import CLI

pytestmark = pytest.mark.skipif(not os.path.isfile(CLI), reason=f"the mxfp8 CLI is not built ({CLI})")


def bench(*args, env=None):
    e = dict(os.environ)
    e.update(env or {})
    r = subprocess.run([CLI, "bench", *map(str, args)], capture_output=True, text=True, timeout=1200, env=e)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    return r


@pytest.fixture(scope="module")
def doc():
    return json.loads(bench("--quick", "--reps", "1", "--json").stdout)


def test_header_and_peaks(doc):
    for k in ("library_version", "isa", "isa_reason", "threads", "reps", "quick", "onednn", "peaks"):
        assert k in doc, k
    p = doc["peaks"]
    assert set(p) >= {"amx", "amx_bf16", "avx512_bf16", "avx512_fp32_fma", "reference"}


def test_quantize_rows(doc):
    rows = doc["quantize"]
    assert {r["axis"] for r in rows} == {"rows", "columns"}
    # the 4096 x 4096 matrix along both axes, then the same values as rows of 256
    assert {(r["axis"], r["rows"], r["cols"]) for r in rows} == {("rows", 4096, 4096), ("columns", 4096, 4096),
                                                                 ("rows", 65536, 256)}
    for r in rows:
        for k in ("threads", "ms", "best_ms", "gbps", "memcpy_gbps", "ratio_to_memcpy", "thread_scaling"):
            assert k in r, k
        # medians of at least 5 runs each, whatever --reps says
        assert r["timed_runs"] >= 5 and r["memcpy_timed_runs"] >= 5, r
        assert r["ratio_to_memcpy"] == pytest.approx(r["gbps"] / r["memcpy_gbps"])
        assert r["best_ms"] <= r["ms"]
    nt = doc["threads"]
    for r in rows:
        if nt > 1 and r["threads"] == nt:
            one = [q for q in rows if (q["axis"], q["rows"], q["cols"]) == (r["axis"], r["rows"], r["cols"])
                   and q["threads"] == 1]
            assert len(one) == 1, r
            one = one[0]
            assert r["thread_scaling"] == pytest.approx(one["ms"] / r["ms"])
        else:
            assert r["thread_scaling"] is None


def test_matmul_rows(doc):
    rows = doc["matmul"]
    assert [(r["op"], r["M"], r["K"], r["N"]) for r in rows] == [
        (op, *s) for s in ((512, 512, 512), (1024, 1024, 1024), (2048, 1024, 512), (512, 1024, 2048))
        for op in ("backward", "forward")]
    for r in rows:
        for k in ("fraction_of_peak", "speedup_vs_onednn", "thread_scaling", "ms_1thread", "onednn_ms", "tflops",
                  "timed_runs"):
            assert k in r, k
        assert r["tflops"] == pytest.approx(r["gflop"] / r["ms"])
        # the fastest timed run's share of the peak beside the median's: the same peak, the time ratio
        assert r["best_ms"] <= r["ms"]
        assert r["fraction_of_peak_best"] == pytest.approx(r["fraction_of_peak"] * r["ms"] / r["best_ms"])
        if r["speedup_vs_onednn"] is not None:
            assert r["speedup_vs_onednn"] == pytest.approx(r["onednn_ms"] / r["ms"])
        if doc["threads"] > 1:
            assert r["thread_scaling"] == pytest.approx(r["ms_1thread"] / r["ms"])


@pytest.mark.parametrize("key", ["moe", "moe_forward"])
def test_moe_rows(doc, key):
    rows = doc[key]
    probs = [(r["H"], r["T"], r["E"], r["B"], r["TopK"], r["I"], r["configuration"]) for r in rows]
    train = [(1024, 2048, 8, 128, 2, 1024), (256, 2048, 8, 128, 2, 512)]  # a training step's two MoE layers
    assert probs == [(*p, "bf16") for p in [(1024, 1024, 4, 512, 4, 256), (1024, 2048, 64, 128, 8, 256), *train]] + \
        [(*p, "training") for p in train]  # --quick: not the larger one; then mxfp8.torch's configuration
    for t in rows[-2:]:  # the same GEMMs: the oneDNN baseline is the BF16 row's
        same = [r for r in rows if r["configuration"] == "bf16" and (r["H"], r["I"]) == (t["H"], t["I"])][0]
        assert t["onednn_ms"] == same["onednn_ms"]
    for r in rows:
        for k in ("blocks", "ms", "fraction_of_peak_real_rows", "fraction_of_peak_all_blocks", "speedup_vs_onednn",
                  "thread_scaling", "gflop_real_rows", "gflop_all_blocks"):
            assert k in r, k
        per_row = 12 if key == "moe" else 6
        assert r["gflop_real_rows"] == pytest.approx(per_row * r["T"] * r["TopK"] * r["H"] * r["I"] / 1e9)
        assert r["best_ms"] <= r["ms"]
        assert r["fraction_of_peak_real_rows_best"] == pytest.approx(
            r["fraction_of_peak_real_rows"] * r["ms"] / r["best_ms"])
        if r["speedup_vs_onednn"] is not None:
            assert r["speedup_vs_onednn"] == pytest.approx(r["onednn_ms"] / r["ms"])
    if key == "moe":
        assert all("peak_rss_bytes" in r and "io_bytes" in r for r in rows)


def test_best_run_beside_median():
    """ "best %" is the fastest timed run's share of the peak: with more than one timed run it differs from the
    median's, by the ratio of the two times (the fixture's single runs cannot tell them apart)."""
    doc = json.loads(bench("matmul", "moe", "--quick", "--reps", "3", "--threads", "1", "--json").stdout)
    pairs = [(r, "fraction_of_peak") for r in doc["matmul"]] + \
        [(r, "fraction_of_peak_real_rows") for k in ("moe", "moe_forward") for r in doc[k]]
    assert len(pairs) == 8 + 12
    for r, key in pairs:
        assert r["timed_runs"] >= 2, r
        assert r["best_ms"] <= r["ms"]
        assert r[key + "_best"] == pytest.approx(r[key] * r["ms"] / r["best_ms"])
    assert any(r["best_ms"] < r["ms"] for r, _ in pairs)


def test_text_for_users():
    r = bench("peak")
    assert r.stdout.count("AMX") >= 1
    assert sum("not available" in line and "AMX" in line for line in r.stdout.splitlines()) <= 1
    for word in ("issue", "seed page", "target (", "targets ("):
        assert word not in r.stdout.lower(), word
    assert "mxfp8 bench --" in r.stdout


def test_plot(tmp_path):
    import matplotlib  # noqa: F401  (scripts/setup.sh --test installs it; its absence fails here)
    out = tmp_path / "bench.png"
    bench("matmul", "--quick", "--reps", "1", "--plot", out, env={"MXFP8_PYTHON": sys.executable})
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert os.listdir(tmp_path) == ["bench.png"]
