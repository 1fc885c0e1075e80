"""examples/finetune_hf_moe.py: 20 steps of a tiny transformers Mixtral train the three runs (BF16, recipes mxfp8 and
ocp) from the same weights, the losses decrease, the MXFP8 runs stay near BF16, and loss.csv / loss.png /
summary.json are written."""

import csv
import importlib.util
import json
import os

import pytest

import transformers  # noqa: E402,F401  (installed by scripts/setup.sh --test: its absence is a failure)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "examples", "finetune_hf_moe.py")
TINY = ["--steps", "20", "--layers", "1", "--width", "64", "--heads", "2", "--experts", "4", "--top-k", "2",
        "--intermediate", "64", "--seq", "64", "--batch", "4", "--block-size", "32", "--eval-every", "10",
        "--eval-batches", "2", "--lr", "3e-3", "--warmup", "5", "--threads", "2"]


def test_finetune_hf_moe_tiny(tmp_path):
    spec = importlib.util.spec_from_file_location("finetune_hf_moe", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    summary = mod.main(TINY + ["--out", str(tmp_path)])
    with open(tmp_path / "loss.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 21
    for run in ("bf16", "mxfp8", "ocp"):
        val = {int(r["step"]): float(r[f"{run}_val_loss"]) for r in rows if r[f"{run}_val_loss"]}
        assert val[20] < val[0] - 0.3, f"{run}: validation loss did not decrease: {val}"
        assert summary[run]["tokens_per_s"] > 0
    # same weights and batches: the first steps agree closely
    first = {run: float(rows[1][f"{run}_train_loss"]) for run in ("bf16", "mxfp8", "ocp")}
    assert abs(first["mxfp8"] - first["bf16"]) < 0.02 and abs(first["ocp"] - first["bf16"]) < 0.02
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "summary.json").read_text())["mxfp8"]["final_val_loss"] == \
        summary["mxfp8"]["final_val_loss"]
