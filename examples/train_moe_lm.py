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

--expert-parallel trains the MXFP8 model alone with its experts split over the processes of a torch.distributed
gloo group (launch it with torchrun; without torchrun it runs as one process): each process holds its share of every
MoE layer's experts (BlockwiseMoE(expert_parallel_group=...)) and takes a contiguous share of each global batch's
sequences; the dense parameters are data-parallel (their gradients summed over the processes by
mxfp8.torch.expert_parallel.all_reduce_dense_gradients). Each process's loss is its part of the global batch's
loss (the sum of its tokens' losses divided by the global token count; the load-balancing loss from globally
counted expert loads), so the gradients are those of the global loss, and the routers are batch-invariant: the MoE
layers' outputs and gradients of the first step are bitwise those of the same run on one process. Writes
DIR/first_step_rank{R}.pt (each MoE layer's output, output gradient, input gradient and expert weight gradients on
that process) and DIR/summary.json (losses, tokens/s per process, bytes moved per step); --check-against DIR1 (the
out directory of the same command run on one process) compares the first step bit for bit and the losses.

    python examples/train_moe_lm.py --expert-parallel --steps 50 --out out/ep1
    torchrun --nproc-per-node 2 examples/train_moe_lm.py --expert-parallel --steps 50 --out out/ep2 \
        --check-against out/ep1
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
        self.global_tokens, self.record = None, None  # --expert-parallel: set by the training loop

    def forward(self, x):
        B, S, D = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, S, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(B, S, D))
        h = self.norm2(x)
        if getattr(self.moe, "expert_parallel_group", None) is not None:
            return self._moe_expert_parallel(x, h)
        # Switch-style load balancing: E * sum_e (fraction of tokens routed to e) * (mean router probability of e)
        probs = torch.softmax(self.moe.router(h).float().reshape(-1, self.moe.num_experts), dim=-1)
        chosen = torch.topk(probs, self.moe.top_k, dim=-1).indices
        frac = F.one_hot(chosen, self.moe.num_experts).float().mean((0, 1))
        aux = self.moe.num_experts * (frac * probs.mean(0)).sum()
        return x + self.moe(h), aux

    def _moe_expert_parallel(self, x, h):
        """The MoE layer of --expert-parallel and this process's part of the load-balancing loss: the expert loads
        counted over every process (an exact integer all-reduce), the router probabilities summed over this
        process's tokens and divided by the global token count (global_tokens), so that the parts sum to the global
        loss and each token's gradient is the single-process one."""
        y, logits = self.moe(h)
        probs = torch.softmax(logits.float().reshape(-1, self.moe.num_experts), dim=-1)
        chosen = torch.topk(probs, self.moe.top_k, dim=-1).indices
        counts = torch.bincount(chosen.reshape(-1), minlength=self.moe.num_experts)
        torch.distributed.all_reduce(counts, group=self.moe.expert_parallel_group)
        frac = counts.float() / (self.global_tokens * self.moe.top_k)
        aux = self.moe.num_experts * (frac * probs.sum(0)).sum() / self.global_tokens
        if self.record is not None:  # the first step's tensors, compared with the one-process run
            h.retain_grad()
            y.retain_grad()
            self.record.update(h=h, y=y)
        return x + y, aux


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
    p.add_argument("--expert-parallel", action="store_true",
                   help="the MXFP8 run alone, its experts split over the processes of a gloo group (torchrun)")
    p.add_argument("--wire", default="native", choices=["native", "bf16", "mxfp8"],
                   help="--expert-parallel: the dispatched rows in their own dtype (BF16 under autocast) or MXFP8")
    p.add_argument("--check-against", metavar="DIR",
                   help="--expert-parallel: compare with the out directory of the same run on one process")
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
    if a.expert_parallel and (a.compile or runs != ["bf16", "mxfp8"]):
        p.error("--expert-parallel trains the MXFP8 run alone, eagerly: drop --runs and --compile")
    if not a.expert_parallel and (a.wire != "native" or a.check_against):
        p.error("--wire and --check-against need --expert-parallel")
    return a

# ---- --expert-parallel ----
def _init_group():
    """The default gloo group: torchrun's environment, or a group of one process without it."""
    import datetime

    import torch.distributed as dist
    if not dist.is_initialized():
        timeout = datetime.timedelta(minutes=10)  # how long a process waits for a peer that failed
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group("gloo", timeout=timeout)
        else:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return dist.group.WORLD, dist.get_rank(), dist.get_world_size()


def build_expert_parallel(a, group):
    """The MXFP8 model with its experts split over `group`: built whole from the seed (the one-process model's
    weights), then each process keeps its experts (split_experts_state_dict)."""
    import functools

    from mxfp8.torch import expert_parallel as ep
    torch.manual_seed(a.seed)
    whole = mt.convert_to_mxfp8(MoELM(a, mt.BlockwiseMoE), recipe=a.recipe, quantize_routers=True)
    moe_cls = functools.partial(mt.BlockwiseMoE, expert_parallel_group=group, expert_parallel_wire=a.wire,
                                output_router_logits=True)
    model = mt.convert_to_mxfp8(MoELM(a, moe_cls), recipe=a.recipe, quantize_routers=True)
    model.load_state_dict(ep.split_experts_state_dict(model, whole.state_dict()))
    return model


def _clip_global(model, group, max_norm=1.0):
    """clip_grad_norm_ over the whole model of all processes: the dense gradients are equal everywhere (after the
    all-reduce), the expert gradients differ: their squares are summed over the processes."""
    import torch.distributed as dist

    from mxfp8.torch import expert_parallel as ep
    experts = set(ep.expert_parameter_names(model))
    sq = torch.zeros(2, dtype=torch.float64)
    for n, p in model.named_parameters():
        if p.grad is not None:
            sq[int(n in experts)] += p.grad.double().pow(2).sum()
    e = sq[1:].clone()
    dist.all_reduce(e, group=group)
    total = float((sq[0] + e[0]).sqrt())
    coef = min(1.0, max_norm / (total + 1e-6))
    if coef < 1.0:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(coef)
    return total


def main_expert_parallel(a):
    import torch.distributed as dist

    from mxfp8.torch import expert_parallel as ep
    own_group = not dist.is_initialized()
    group, rank, P = _init_group()
    threads = a.threads or max(1, (os.cpu_count() or 1) // P)
    torch.set_num_threads(threads)
    mxfp8.set_num_threads(threads)
    if a.batch < P:
        sys.exit(f"train_moe_lm: --batch {a.batch} gives no sequence to some of the {P} processes")
    lo, n = ep.expert_range(a.batch, P, rank)  # this process's sequences of each global batch (contiguous)
    data, val, _, _ = load_corpus()
    vr = np.random.default_rng(a.seed + 2)
    val_batches = [windows(val, vr.integers(0, len(val) - a.seq - 1, a.batch), a.seq) for _ in range(a.eval_batches)]
    model = build_expert_parallel(a, group)
    blocks = list(model.blocks)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    rng = np.random.default_rng(a.seed + 1)  # the same global batches as the one-process run
    N = a.batch * a.seq

    def global_loss(xs, ys):
        for b in blocks:
            b.global_tokens = N
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits, aux = model(xs)
        ce = F.cross_entropy(logits.float().reshape(-1, 256), ys.reshape(-1), reduction="sum") / N
        return ce, aux

    def evaluate_ep():
        model.eval()
        tot = torch.zeros(1, dtype=torch.float64)
        with torch.no_grad():
            for x, y in val_batches:
                tot += global_loss(x[lo:lo + n], y[lo:lo + n])[0].double()
        model.train()
        dist.all_reduce(tot, group=group)
        return float(tot[0]) / len(val_batches)

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    train_losses, val_losses, busy, moved = [], {0: evaluate_ep()}, 0.0, []
    for step in range(1, a.steps + 1):
        x, y = windows(data, rng.integers(0, len(data) - a.seq - 1, a.batch), a.seq)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a)
        for b in blocks:
            b.record = {} if step == 1 else None
        t0 = time.perf_counter()
        ce, aux = global_loss(x[lo:lo + n], y[lo:lo + n])
        opt.zero_grad(set_to_none=True)
        (ce + a.aux_weight * aux / len(blocks)).backward()
        if step == 1:
            first = {}
            for i, b in enumerate(blocks):
                r = b.record
                first[i] = {"y": r["y"].detach(), "dy": r["y"].grad, "dh": r["h"].grad,
                            "gate_up_proj_weight_grad": b.moe.gate_up_proj_weight.grad.clone(),
                            "down_proj_weight_grad": b.moe.down_proj_weight.grad.clone(),
                            "expert_range": b.moe.expert_range, "rows": (lo * a.seq, (lo + n) * a.seq)}
                b.record = None
            torch.save(first, out / f"first_step_rank{rank}.pt")
        ep.all_reduce_dense_gradients(model, group)
        _clip_global(model, group)
        opt.step()
        busy += time.perf_counter() - t0
        sent = {}
        for b in blocks:  # bytes this process sent to the others in the step, by exchange
            for k, v in b.moe.expert_parallel_stats.items():
                if k.endswith("_bytes_sent"):
                    kind = "combine" if "combine" in k else "dispatch"  # dispatch: rows, pair records, counts
                    sent[kind] = sent.get(kind, 0) + v
        moved.append(sent)
        tot = ce.detach().double().reshape(1)
        dist.all_reduce(tot, group=group)
        train_losses.append(float(tot[0]))
        if not math.isfinite(train_losses[-1]):
            sys.exit(f"train_moe_lm: loss is {train_losses[-1]} at step {step}")
        if step % a.eval_every == 0 or step == a.steps:
            val_losses[step] = evaluate_ep()
        if rank == 0 and not a.no_progress and (step % max(1, a.steps // 20) == 0 or step == a.steps):
            print(f"step {step}/{a.steps}: loss {train_losses[-1]:.4f}, val {val_losses[max(val_losses)]:.4f}, "
                  f"{n * a.seq * step / busy:.0f} tokens/s on this process", flush=True)
    per_proc = [None] * P
    mean = {k: round(sum(m.get(k, 0) for m in moved) / len(moved)) for k in ("dispatch", "combine")}
    dist.all_gather_object(per_proc, {"tokens_per_s": round(n * a.seq * len(train_losses) / busy, 1),
                                      "bytes_sent_per_step": mean["dispatch"] + mean["combine"],
                                      "dispatch_bytes_sent_per_step": mean["dispatch"],
                                      "combine_bytes_sent_per_step": mean["combine"]}, group=group)
    summary = {"processes": P, "wire": a.wire, "steps": a.steps, "tokens_per_step": N, "recipe": a.recipe,
               "threads_per_process": threads, "train_losses": train_losses,
               "val_losses": {str(k): v for k, v in val_losses.items()}, "per_process": per_proc}
    # the network model at more processes: this run's tokens per process (weak scaling), max(E, P) experts, uniform
    # top-k routing; bytes per process and step over all layers, and their time on a link of each bandwidth
    step_s = busy / len(train_losses)
    summary["network_model"] = []
    for Pm in (8, 64):
        b = ep.exchange_bytes(N // P, max(a.experts, Pm), a.top_k, a.width, Pm, wire=a.wire)
        total = a.layers * (b["forward"] + b["backward"])
        summary["network_model"].append({"processes": Pm, "experts": max(a.experts, Pm), "bytes_per_step": round(total),
                                         **{f"ms_at_{g}_gbps": 1e3 * total * 8 / (g * 1e9) for g in (100, 400)}})
    summary["step_seconds_measured"] = step_s
    if a.check_against:
        summary["check"] = _check_first_step(a, rank, group, out, train_losses)
    if rank == 0:
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        for q, d in enumerate(per_proc):
            print(f"process {q}: {d['tokens_per_s']:.0f} tokens/s, {d['bytes_sent_per_step'] / 1e6:.3f} MB sent to "
                  f"the other processes per step (forward and backward: dispatch "
                  f"{d['dispatch_bytes_sent_per_step'] / 1e6:.3f} MB, combine "
                  f"{d['combine_bytes_sent_per_step'] / 1e6:.3f} MB)")
        print(f"final validation loss {val_losses[a.steps]:.4f}")
        for m in summary["network_model"]:
            print(f"network model, {m['processes']} processes ({m['experts']} experts, {N // P} tokens each): "
                  f"{m['bytes_per_step'] / 1e6:.2f} MB sent per process and step, {m['ms_at_100_gbps']:.2f} ms at "
                  f"100 Gb/s, {m['ms_at_400_gbps']:.2f} ms at 400 Gb/s (a step here: {step_s * 1e3:.0f} ms)")
        if "check" in summary:
            c = summary["check"]
            print(f"first step vs one process: MoE outputs and gradients bitwise equal on every process: "
                  f"{c['first_step_bitwise_equal']}; largest training-loss difference over {a.steps} steps: "
                  f"{c['max_train_loss_diff']:.3g}")
        print(f"wrote {out / 'summary.json'}")
    dist.barrier(group=group)
    if own_group:  # a gloo group left to the interpreter's exit can abort the process (its threads outlive Python)
        dist.destroy_process_group()
    return summary


def _same_bits(a, b):
    bits = {2: torch.int16, 4: torch.int32}
    return a.shape == b.shape and a.dtype == b.dtype and \
        torch.equal(a.contiguous().view(bits[a.element_size()]), b.contiguous().view(bits[b.element_size()]))


def _check_first_step(a, rank, group, out, train_losses):
    """Compare this process's first-step MoE tensors with the one-process run's in a.check_against (bit for bit)
    and the training losses; the verdicts of all processes are combined."""
    import torch.distributed as dist
    ref = torch.load(Path(a.check_against) / "first_step_rank0.pt")
    mine = torch.load(out / f"first_step_rank{rank}.pt")
    diffs = []
    for i, m in mine.items():
        r0, r1 = m["rows"]
        e0, ne = m["expert_range"]
        r = ref[i]
        pairs = [(k, m[k].reshape(-1, a.width), r[k].reshape(-1, a.width)[r0:r1]) for k in ("y", "dy", "dh")]
        pairs += [(k, m[k], r[k][e0:e0 + ne]) for k in ("gate_up_proj_weight_grad", "down_proj_weight_grad")]
        for k, got, want in pairs:
            if not _same_bits(got, want):
                diffs.append(f"layer {i} {k}")
    verdicts = [None] * dist.get_world_size(group)
    dist.all_gather_object(verdicts, diffs, group=group)
    ref_summary = json.loads((Path(a.check_against) / "summary.json").read_text())
    ref_losses = ref_summary["train_losses"]
    k = min(len(ref_losses), len(train_losses))
    return {"against": {"dir": str(a.check_against), "processes": ref_summary["processes"],
                        "wire": ref_summary["wire"]},
            "first_step_bitwise_equal": all(not v for v in verdicts),
            "first_step_differences": [d for v in verdicts for d in v],
            "max_train_loss_diff": max(abs(x - y) for x, y in zip(train_losses[:k], ref_losses[:k]))}


def main(argv=None):
    a = parse_args(argv)
    if a.expert_parallel:
        return main_expert_parallel(a)
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
