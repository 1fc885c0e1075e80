"""benchmarks/train_step.py: what it reports (the printed lines, the JSON's ratios and breakdown), never how fast
anything is. One tiny run (D = 32, one timed step)."""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "benchmarks", "train_step.py")


def test_train_step_reports_ratio_and_breakdown(tmp_path):
    out = tmp_path / "step.json"
    r = subprocess.run([sys.executable, SCRIPT, "--dims", "32", "--steps", "1", "--threads", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "D=32 I=64: bf16 step" in r.stdout and "ratio bf16/mxfp8" in r.stdout
    assert "library calls" in r.stdout and "mxfp8_moe_backward" in r.stdout
    doc = json.loads(out.read_text())
    d = doc["dims"]["32"]
    assert d["shape"] == {"D": 32, "tokens": 2048, "experts": 8, "top_k": 2, "I": 64, "block_size": 128}
    for run in ("bf16", "mxfp8"):
        for key in ("step", "forward_backward", "optimizer", "library"):
            assert d[run][key] >= 0
    assert d["bf16"]["library"] == 0  # the BF16 model makes no library call
    calls = d["mxfp8"]["library_by_call"]
    assert {"mxfp8_moe_forward", "mxfp8_moe_backward", "mxfp8_linear", "mxfp8_matmul_backward"} <= set(calls)
    assert abs(d["ratio_bf16_over_mxfp8"] - d["bf16"]["step"] / d["mxfp8"]["step"]) < 1e-9
    assert d["mxfp8"]["library"] <= d["mxfp8"]["forward_backward"] + 1e-6


def test_train_step_bad_arguments():
    r = subprocess.run([sys.executable, SCRIPT, "--dims", "4"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--dims takes widths >= 8" in r.stderr
