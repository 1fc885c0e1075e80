#!/usr/bin/env python3
"""Train a small decoder-only Mixture-of-Experts language model twice from the same seed -- once with every linear
layer and the MoE experts in MXFP8 (mxfp8.torch), once in plain torch BF16 -- and compare the loss curves.

The corpus is on every machine without a download: the Python standard library's own source files (the .py files
under sysconfig.get_paths()["stdlib"], site-packages excluded), read as bytes (vocabulary of 256), split into
training and validation by file (a file goes to validation when crc32 of its relative path % 10 == 0), so the
split is deterministic and no file is in both.

Both runs use the same model (pre-norm transformer: learned positions, causal multi-head attention, a top-k routed
MoE feed-forward layer with SwiGLU experts, a Switch-style load-balancing loss), the same initial weights, the same
batches, FP32 master weights with AdamW, and torch.autocast(bfloat16) on the CPU. The only difference: in the
MXFP8 run every nn.Linear (attention projections, routers, output layer) is an MXFP8Linear and every MoE layer is
an mxfp8.torch.BlockwiseMoE; in the BF16 run those are torch's own bf16 matmuls.

The two runs train in lockstep (one step of each in turn), so that a busy shared machine slows both alike; tokens/s
counts the training steps only (forward, backward, optimizer), not the evaluations.

Writes DIR/loss.csv (step, train and validation loss of both runs; validation every --eval-every steps),
DIR/loss.png (the curves) and DIR/summary.json (tokens/s of both runs, final validation losses and their gap).

Needs torch (and mxfp8.torch's other requirements); tqdm (the progress bar) and matplotlib (loss.png) are optional:
without them the run prints a line every 5% of the steps and writes no loss.png (scripts/setup.sh --test installs
both into .venv).

    python examples/train_moe_lm.py --steps 300 --out out/train_moe_lm
"""

import argparse
import csv
import json
import math
import os
import sys
import sysconfig
import time
import zlib
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import mxfp8
import mxfp8.torch as mt


# ---- data ----
def load_corpus():
    """(train bytes, validation bytes, number of files of each) of the standard library's .py sources."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if not {"site-packages", "dist-packages"} & set(p.parts))
    if not files:
        sys.exit(f"train_moe_lm: no .py files under {root}")
    parts = {False: [], True: []}
    for p in files:
        rel = p.relative_to(root).as_posix()
        parts[zlib.crc32(rel.encode()) % 10 == 0].append(p.read_bytes())
    train, val = (np.frombuffer(b"\n".join(parts[k]), dtype=np.uint8).copy() for k in (False, True))
    return train, val, len(parts[False]), len(parts[True])


def windows(data, starts, seq):
    idx = torch.from_numpy(starts)[:, None] + torch.arange(seq + 1)[None, :]
    chunk = torch.from_numpy(data)[idx].long()
    return chunk[:, :-1], chunk[:, 1:]


# ---- model ----
class TorchMoE(mt.BlockwiseMoE):
    """The same layer (parameters, initialization, router) computed with plain torch ops: the BF16 reference.
    Tokens are sorted by expert once, each expert multiplies its contiguous slice (torch's bf16 GEMMs under
    autocast), and the weighted results are added back to their tokens."""

    def forward(self, hidden_states):
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, self.hidden_size)
        probs = torch.softmax(self.router(x).float(), dim=-1)
        top, ids = torch.topk(probs, self.top_k, dim=-1)
        w = (top / top.sum(-1, keepdim=True)).reshape(-1)
        order = torch.argsort(ids.reshape(-1), stable=True)
        tok = order // self.top_k
        xs = x[tok]
        counts = torch.bincount(ids.reshape(-1), minlength=self.num_experts).tolist()
        E, H, I = self.num_experts, self.hidden_size, self.intermediate_size
        ys = []
        # split / unbind rather than indexing: their backward is one concatenation, not a zero-filled copy per expert
        w1s, w2s = self.gate_up_proj_weight.reshape(E, H, 2 * I).unbind(0), self.down_proj_weight.unbind(0)
        for xe, w1, w2 in zip(xs.split(counts), w1s, w2s):
            if xe.shape[0]:
                g, u = (xe @ w1).chunk(2, dim=-1)
                ys.append((F.silu(g) * u) @ w2)
        y = torch.cat(ys) * w[order, None]
        dt = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype
        out = torch.zeros(x.shape, dtype=dt).index_add(0, tok, y.to(dt))  # as BlockwiseMoE: autocast dtype out
        return out.reshape(shape)


class Block(nn.Module):
    def __init__(self, a, moe_cls):
        super().__init__()
        self.heads = a.heads
        self.norm1, self.norm2 = nn.RMSNorm(a.width), nn.RMSNorm(a.width)
        self.qkv = nn.Linear(a.width, 3 * a.width, bias=False)
        self.proj = nn.Linear(a.width, a.width, bias=False)
        self.moe = moe_cls(a.width, a.intermediate, a.experts, a.top_k, block_size=a.block_size, recipe=a.recipe)

    def forward(self, x):
        B, S, D = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, S, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(B, S, D))
        h = self.norm2(x)
        # Switch-style load balancing: E * sum_e (fraction of tokens routed to e) * (mean router probability of e)
        probs = torch.softmax(self.moe.router(h).float().reshape(-1, self.moe.num_experts), dim=-1)
        chosen = torch.topk(probs, self.moe.top_k, dim=-1).indices
        frac = F.one_hot(chosen, self.moe.num_experts).float().mean((0, 1))
        aux = self.moe.num_experts * (frac * probs.mean(0)).sum()
        return x + self.moe(h), aux


class MoELM(nn.Module):
    def __init__(self, a, moe_cls):
        super().__init__()
        self.tok = nn.Embedding(256, a.width)
        self.pos = nn.Embedding(a.seq, a.width)
        self.blocks = nn.ModuleList([Block(a, moe_cls) for _ in range(a.layers)])
        self.norm = nn.RMSNorm(a.width)
        self.head = nn.Linear(a.width, 256, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        aux = 0.0
        for blk in self.blocks:
            x, a = blk(x)
            aux = aux + a
        return self.head(self.norm(x)), aux / len(self.blocks)


def build(a, mxfp8_run):
    torch.manual_seed(a.seed)
    model = MoELM(a, mt.BlockwiseMoE if mxfp8_run else TorchMoE)
    if mxfp8_run:
        # routers too (convert_to_mxfp8 keeps them in FP32 by default): this run measures an all-MXFP8 model
        mt.convert_to_mxfp8(model, recipe=a.recipe, quantize_routers=True)
    return model


# ---- training ----
def lr_at(step, a):
    if step <= a.warmup:
        return a.lr * step / a.warmup
    t = (step - a.warmup) / max(1, a.steps - a.warmup)
    return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def loss_of(model, x, y, a):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, aux = model(x)
    ce = F.cross_entropy(logits.float().reshape(-1, 256), y.reshape(-1))
    return ce, aux


@torch.no_grad()
def evaluate(model, val_batches, a):
    model.eval()
    tot = sum(loss_of(model, x, y, a)[0].item() for x, y in val_batches)
    model.train()
    return tot / len(val_batches)


class Run:
    """One training run: its model, optimizer and batch stream; step() trains one step and times it."""

    def __init__(self, name, a, data):
        self.name, self.a, self.data = name, a, data
        self.model = build(a, name == "mxfp8")
        self.fn = torch.compile(self.model) if a.compile else self.model
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
        self.rng = np.random.default_rng(a.seed + 1)  # the same batches for both runs
        self.train_losses, self.val_losses, self.busy = [], {}, 0.0

    def step(self, step):
        a = self.a
        x, y = windows(self.data, self.rng.integers(0, len(self.data) - a.seq - 1, a.batch), a.seq)
        for g in self.opt.param_groups:
            g["lr"] = lr_at(step, a)
        t0 = time.perf_counter()
        ce, aux = loss_of(self.fn, x, y, a)
        self.opt.zero_grad(set_to_none=True)
        (ce + a.aux_weight * aux).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.busy += time.perf_counter() - t0
        self.train_losses.append(ce.item())
        if not math.isfinite(self.train_losses[-1]):
            sys.exit(f"train_moe_lm: {self.name} loss is {self.train_losses[-1]} at step {step}")

    def tokens_per_s(self):
        return len(self.train_losses) * self.a.batch * self.a.seq / self.busy if self.busy else 0.0


def train(runs, val_batches, a, progress):
    """Train the runs in lockstep (one step of each in turn, so that a busy shared machine slows both alike) and
    evaluate them every --eval-every steps."""
    for r in runs:
        r.val_losses[0] = evaluate(r.model, val_batches, a)
    bar = progress(range(1, a.steps + 1), desc="train", unit="step", dynamic_ncols=True)
    for step in bar:
        for r in runs:
            r.step(step)
        if step % a.eval_every == 0 or step == a.steps:
            for r in runs:
                r.val_losses[step] = evaluate(r.model, val_batches, a)
        post = {}
        for r in runs:
            post[f"{r.name} loss"] = f"{r.train_losses[-1]:.3f}"
            post[f"{r.name} val"] = f"{r.val_losses[max(r.val_losses)]:.3f}"
            post[f"{r.name} tok/s"] = f"{r.tokens_per_s():.0f}"
        bar.set_postfix(post)
    return {r.name: (r.train_losses, r.val_losses, r.tokens_per_s()) for r in runs}


def _pyplot():
    """matplotlib's pyplot (Agg), or None when matplotlib is not installed: it is optional (loss.png only)."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


class _Steps:
    """The progress of the training loop without tqdm: a line every ~5% of the steps (none with --no-progress)."""

    def __init__(self, it, quiet):
        self.it, self.quiet, self.n, self.step = it, quiet, len(it), 0

    def __iter__(self):
        for self.step in self.it:
            yield self.step

    def set_postfix(self, post):
        if not self.quiet and (self.step % max(1, self.n // 20) == 0 or self.step == self.n):
            print(f"step {self.step}/{self.n}: " + ", ".join(f"{k} {v}" for k, v in post.items()), flush=True)


def write_outputs(a, runs):
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    names = list(runs)
    with open(out / "loss.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step"] + [f"{n}_{k}_loss" for n in names for k in ("train", "val")])
        for step in range(0, a.steps + 1):
            row = [step]
            for n in names:
                tr, va, _ = runs[n]
                row += ["" if step == 0 else f"{tr[step - 1]:.6f}", f"{va[step]:.6f}" if step in va else ""]
            w.writerow(row)
    plt = _pyplot()
    if plt is None:  # main() said so at the start
        return out, ["loss.csv"]
    both = len(names) == 2
    fig, axes = plt.subplots(2 if both else 1, 1, figsize=(8, 6 if both else 4.5), dpi=100, sharex=True,
                             gridspec_kw={"height_ratios": [3, 1]} if both else None, squeeze=False)
    ax = axes[0][0]
    colors = {"bf16": "tab:blue", "mxfp8": "tab:orange"}
    for n in names:
        tr, va, tps = runs[n]
        k = max(1, a.steps // 50)  # running mean of the per-step training loss, for readability
        sm = np.convolve(tr, np.ones(k) / k, mode="valid")
        ax.plot(np.arange(k, a.steps + 1), sm, color=colors.get(n), alpha=0.6, lw=1,
                label=f"{n} train (mean of {k} steps)")
        ax.plot(sorted(va), [va[s] for s in sorted(va)], "o-", color=colors.get(n), ms=3, lw=1.5,
                label=f"{n} validation, {tps:.0f} tokens/s")
    ax.set_ylabel("cross-entropy (nats/byte)")
    # the axis shows the training after its first steep drop (the first evaluation after step 0 and below)
    lo = min(min(v.values()) for _, v, _ in runs.values())
    later = [x for _, v, _ in runs.values() for s, x in v.items() if s > 0]
    hi = max(later) if later else max(max(v.values()) for _, v, _ in runs.values())
    ax.set_ylim(lo - 0.05 * (hi - lo) - 0.01, hi + 0.15 * (hi - lo) + 0.01)
    ax.set_title(f"MoE LM on the Python stdlib sources: {a.layers} layers, width {a.width}, {a.experts} experts "
                 f"top-{a.top_k}, {a.batch}x{a.seq} tokens/step", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if both:
        vb, vm = runs["bf16"][1], runs["mxfp8"][1]
        steps = sorted(vb)
        gap = [100 * (vm[s] - vb[s]) / vb[s] for s in steps]
        axes[1][0].axhline(0, color="gray", lw=0.8)
        axes[1][0].plot(steps, gap, "o-", color="tab:red", ms=3, lw=1.2)
        axes[1][0].set_ylabel("val gap (%)\nmxfp8 vs bf16", fontsize=8)
        axes[1][0].grid(alpha=0.3)
    axes[-1][0].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(out / "loss.png")
    return out, ["loss.csv", "loss.png"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=300, help="training steps per run (default 300)")
    p.add_argument("--out", default="out/train_moe_lm", help="output directory (loss.csv, loss.png, summary.json)")
    p.add_argument("--runs", default="bf16,mxfp8", help="comma-separated runs: bf16, mxfp8 (default both)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=256, help="model width = MoE hidden size H")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=512, help="expert intermediate size I")
    p.add_argument("--seq", type=int, default=256, help="sequence length (bytes)")
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--block-size", type=int, default=128, help="MoE block size (positions per block)")
    p.add_argument("--recipe", default="mxfp8", choices=sorted(mt.RECIPES), help="MXFP8 recipe (default mxfp8)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--aux-weight", type=float, default=0.01, help="weight of the load-balancing loss")
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch and mxfp8 threads (default: all cores)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (both runs)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    a = p.parse_args(argv)
    runs = [r.strip() for r in a.runs.split(",") if r.strip()]
    if not runs or set(runs) - {"bf16", "mxfp8"}:
        p.error(f"--runs: expected bf16 and/or mxfp8, got {a.runs!r}")
    a.runs = runs
    for opt in ("steps", "layers", "width", "heads", "experts", "intermediate", "seq", "batch", "block_size",
                "eval_every", "eval_batches"):  # each a usage error here, not a traceback from the model's constructor
        if getattr(a, opt) < 1:
            p.error(f"--{opt.replace('_', '-')} must be >= 1, got {getattr(a, opt)}")
    if a.width % a.heads:
        p.error(f"--width {a.width} must be a multiple of --heads {a.heads}")
    if not 1 <= a.top_k <= a.experts:
        p.error(f"--top-k must be in [1, --experts = {a.experts}], got {a.top_k}")
    if a.threads < 0 or a.warmup < 0:
        p.error(f"--threads and --warmup must be >= 0 (--threads 0: all cores), got {a.threads} and {a.warmup}")
    return a


def main(argv=None):
    a = parse_args(argv)
    threads = a.threads or os.cpu_count()
    torch.set_num_threads(threads)
    mxfp8.set_num_threads(threads)
    try:  # optional: the progress bar
        from tqdm import tqdm
    except ImportError:
        tqdm = None
        if not a.no_progress:
            print("train_moe_lm: note: tqdm is not installed (pip install tqdm): a line every 5% of the steps "
                  "instead of a progress bar", file=sys.stderr)
    if _pyplot() is None:  # optional: the picture
        print("train_moe_lm: note: matplotlib is not installed (pip install matplotlib): loss.png will not be "
              "drawn; loss.csv and summary.json hold the numbers", file=sys.stderr)

    def progress(it, **kw):
        return tqdm(it, disable=a.no_progress, **kw) if tqdm else _Steps(it, a.no_progress)
    data, val, n_train, n_val = load_corpus()
    print(f"corpus: {len(data) / 1e6:.1f} MB of training bytes ({n_train} files), {len(val) / 1e6:.1f} MB of "
          f"validation bytes ({n_val} files) from {sysconfig.get_paths()['stdlib']}")
    vr = np.random.default_rng(a.seed + 2)
    val_batches = [windows(val, vr.integers(0, len(val) - a.seq - 1, a.batch), a.seq) for _ in range(a.eval_batches)]
    runs = [Run(name, a, data) for name in a.runs]
    first = runs[0].model.state_dict()
    for r in runs[1:]:
        sd = r.model.state_dict()
        if sd.keys() != first.keys() or not all(torch.equal(sd[k], first[k]) for k in sd):
            sys.exit("train_moe_lm: the two runs do not start from the same weights")
    runs = train(runs, val_batches, a, progress)
    out, written = write_outputs(a, runs)
    summary = {"steps": a.steps, "tokens_per_step": a.batch * a.seq, "recipe": a.recipe, "threads": threads,
               "isa": mxfp8.info()["isa"]}
    for name, (tr, va, tps) in runs.items():
        summary[name] = {"tokens_per_s": round(tps, 1), "final_val_loss": va[a.steps], "final_train_loss": tr[-1]}
        print(f"{name:>5}: {tps:8.0f} tokens/s, final validation loss {va[a.steps]:.4f}")
    if len(runs) == 2:
        b, m = runs["bf16"][1][a.steps], runs["mxfp8"][1][a.steps]
        summary["val_loss_gap"] = m - b
        summary["val_loss_gap_pct"] = 100 * (m - b) / b
        print(f"final validation-loss gap (mxfp8 - bf16): {m - b:+.4f} nats/byte ({100 * (m - b) / b:+.2f}%); "
              f"mxfp8 speed {runs['mxfp8'][2] / runs['bf16'][2]:.2f}x bf16")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("wrote " + ", ".join(str(out / f) for f in written + ["summary.json"]))
    return summary


if __name__ == "__main__":
    main()
