"""examples/train_moe_lm.py: 20 steps of a tiny configuration train both runs (MXFP8 and BF16) from the same
weights, the losses decrease, and loss.csv / loss.png / summary.json are written; --help lists the options."""

import csv
import importlib.util
import json
import os
import subprocess
import sys

import mxfp8

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "examples", "train_moe_lm.py")
TINY = ["--steps", "20", "--layers", "1", "--width", "64", "--heads", "2", "--experts", "4", "--top-k", "2",
        "--intermediate", "64", "--seq", "64", "--batch", "4", "--block-size", "32", "--eval-every", "10",
        "--eval-batches", "2", "--lr", "3e-3", "--warmup", "5", "--no-progress"]


def _load():
    spec = importlib.util.spec_from_file_location("train_moe_lm", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_train_moe_lm_tiny(tmp_path):
    summary = _load().main(TINY + ["--out", str(tmp_path)])
    with open(tmp_path / "loss.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == list(range(21))
    for run in ("bf16", "mxfp8"):
        train = [float(r[f"{run}_train_loss"]) for r in rows[1:]]
        val = {int(r["step"]): float(r[f"{run}_val_loss"]) for r in rows if r[f"{run}_val_loss"]}
        assert sorted(val) == [0, 10, 20]
        assert sum(train[-5:]) / 5 < sum(train[:5]) / 5 - 0.3, f"{run}: training loss did not decrease: {train}"
        assert val[20] < val[0] - 0.3, f"{run}: validation loss did not decrease: {val}"
        assert summary[run]["tokens_per_s"] > 0
    # same initial weights and batches: the first losses agree closely, the runs differ only by MXFP8 rounding
    assert abs(float(rows[1]["bf16_train_loss"]) - float(rows[1]["mxfp8_train_loss"])) < 0.02
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert abs(saved["val_loss_gap"] - (saved["mxfp8"]["final_val_loss"] - saved["bf16"]["final_val_loss"])) < 1e-9


def test_train_moe_lm_help():
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(mxfp8.__file__))))
    r = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    for opt in ("--steps", "--out", "--recipe", "--experts", "--top-k", "--runs", "--compile"):
        assert opt in r.stdout


def test_train_moe_lm_without_tqdm_and_matplotlib(tmp_path, monkeypatch, capsys):
    """tqdm and matplotlib are optional: without them (imports fail) the run says so at the start, prints a line
    every 5% of the steps instead of the bar, and writes loss.csv and summary.json but no loss.png."""
    monkeypatch.setitem(sys.modules, "tqdm", None)  # `import tqdm` now raises ImportError
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    args = [a for a in TINY if a != "--no-progress"]
    args[args.index("--steps") + 1] = "4"
    args[args.index("--eval-every") + 1] = "2"
    _load().main(args + ["--runs", "mxfp8", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert "tqdm is not installed" in err and "matplotlib is not installed" in err
    assert "step 4/4: mxfp8 loss" in out
    assert sorted(os.listdir(tmp_path)) == ["loss.csv", "summary.json"]
    assert f"wrote {tmp_path / 'loss.csv'}, {tmp_path / 'summary.json'}" in out


EP_TINY = ["--expert-parallel", "--steps", "2", "--layers", "1", "--width", "64", "--heads", "2", "--experts", "3",
           "--top-k", "2", "--intermediate", "32", "--seq", "32", "--batch", "3", "--block-size", "16",
           "--eval-every", "10", "--eval-batches", "1", "--threads", "1", "--no-progress"]


def test_train_moe_lm_expert_parallel_first_step_equals_one_process(tmp_path):
    """--expert-parallel on 2 processes (torchrun, E = 3 experts split 2 + 1, 3 sequences split 2 + 1): the first
    step's MoE outputs, output and input gradients and expert weight gradients equal the 1-process run's bit for bit
    (the example compares them with --check-against), and the losses track it."""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(mxfp8.__file__))),
               OMP_NUM_THREADS="1")
    one, two = tmp_path / "one", tmp_path / "two"
    r = subprocess.run([sys.executable, SCRIPT, *EP_TINY, "--out", str(one)], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        SCRIPT, *EP_TINY, "--out", str(two), "--check-against", str(one)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads((two / "summary.json").read_text())
    assert s["processes"] == 2 and len(s["per_process"]) == 2
    assert s["check"]["first_step_bitwise_equal"], s["check"]
    assert s["check"]["max_train_loss_diff"] < 1e-3, s["check"]
    assert all(p["bytes_sent_per_step"] > 0 and p["tokens_per_s"] > 0 for p in s["per_process"])
    # the check can fail: one expert weight gradient of the reference moved by one unit in the last place
    import shutil

    import torch
    bad = tmp_path / "bad"
    shutil.copytree(one, bad)
    ref = torch.load(bad / "first_step_rank0.pt")
    g = ref[0]["down_proj_weight_grad"]
    g.view(-1)[-1] = torch.nextafter(g.view(-1)[-1].float(), torch.tensor(float("inf"))).to(g.dtype) \
        if g.dtype == torch.float32 else (g.view(-1)[-1].view(torch.int16) + 1).view(g.dtype)
    torch.save(ref, bad / "first_step_rank0.pt")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        SCRIPT, *EP_TINY, "--steps", "1", "--out", str(tmp_path / "again"), "--check-against",
                        str(bad)], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    c = json.loads((tmp_path / "again" / "summary.json").read_text())["check"]
    assert not c["first_step_bitwise_equal"] and c["first_step_differences"] == ["layer 0 down_proj_weight_grad"], c
