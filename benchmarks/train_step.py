#!/usr/bin/env python3
"""One training step of a small model, BF16 autocast against MXFP8, timed in one process (ratios of times measured
in the same run; absolute times on a shared machine drift by 10-30%).

    python benchmarks/train_step.py [--dims 1024,256] [--steps 6] [--threads 2] [--json PATH]

The model, per width D: 2048 tokens of width D; dense layers Linear(D, D), a gated mixer Linear(D, 2D) ->
a * silu(b) -> Linear(D, D), an MLP Linear(D, 4D) -> GELU -> Linear(4D, D), LayerNorms, one MoE (E = 8 experts,
top-2, intermediate size I = D from D = 512 up and 2D below: I = 1024 at D = 1024, 512 at D = 256; block size
128, SiLU-gated experts), a head Linear(D, 256) with cross-entropy on fixed targets; AdamW on FP32 master weights; the forward
under torch.autocast("cpu", bfloat16).
  - bf16:  torch's modules; the MoE is examples/train_moe_lm.py's TorchMoE (tokens sorted by expert, one bf16 GEMM
           per expert: the same parameters and router as BlockwiseMoE);
  - mxfp8: the same model after mxfp8.torch.convert_to_mxfp8(recipe "mxfp8": E4M3, RCEIL): every dense Linear an
           MXFP8Linear, the MoE a BlockwiseMoE, the router kept in its own precision (the default).
Steps alternate between the two models (after a warm-up step each); each figure is the median over --steps.
Printed per D: both step times, ratio = bf16 step time / mxfp8 step time (1.0 = MXFP8 at BF16's price; > 1:
MXFP8 faster), and the breakdown of each step: forward + backward, optimizer, and for mxfp8 the time inside
library calls (every mxfp8 C call, by function) -- the rest of forward + backward is torch's ops and the
mxfp8.torch glue around the calls.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import mxfp8
import mxfp8._lib as _lib
import mxfp8.torch as mt

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
from train_moe_lm import TorchMoE  # noqa: E402  (the BF16 MoE reference of the training example)

TOKENS, EXPERTS, TOP_K, BLOCK, VOCAB = 2048, 8, 2, 128, 256


class StepModel(nn.Module):
    def __init__(self, D, I, moe_cls):
        super().__init__()
        self.norm1, self.norm2, self.norm3, self.norm4 = (nn.LayerNorm(D) for _ in range(4))
        self.dense = nn.Linear(D, D)
        self.mix_in, self.mix_out = nn.Linear(D, 2 * D), nn.Linear(D, D)
        self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.moe = moe_cls(D, I, EXPERTS, TOP_K, block_size=BLOCK, recipe="mxfp8")
        self.head = nn.Linear(D, VOCAB)

    def forward(self, x):
        x = x + self.dense(self.norm1(x))
        a, b = self.mix_in(self.norm2(x)).chunk(2, dim=-1)
        x = x + self.mix_out(a * F.silu(b))
        x = x + self.fc2(F.gelu(self.fc1(self.norm3(x))))
        x = x + self.moe(self.norm4(x))
        return self.head(x)


class LibraryTimer:
    """Seconds spent inside mxfp8's C calls, by function (wraps mxfp8._lib.call, through which the package and
    mxfp8.torch make every call)."""

    def __init__(self):
        self.seconds = {}
        self._call = None

    def __enter__(self):
        self._call = _lib.call

        def timed(name, *args):
            t0 = time.perf_counter()
            try:
                return self._call(name, *args)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

        _lib.call = timed
        return self

    def __exit__(self, *exc):
        _lib.call = self._call


class Run:
    def __init__(self, name, D, I, seed):
        torch.manual_seed(seed)
        self.name = name
        self.model = StepModel(D, I, TorchMoE if name == "bf16" else mt.BlockwiseMoE)
        if name == "mxfp8":
            mt.convert_to_mxfp8(self.model, recipe="mxfp8")
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.times = {"step": [], "forward_backward": [], "optimizer": [], "library": []}
        self.library_by_call = {}

    def step(self, x, y, record=True):
        with LibraryTimer() as lib:
            t0 = time.perf_counter()
            self.opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = self.model(x)
            loss = F.cross_entropy(logits.float(), y)
            loss.backward()
            t1 = time.perf_counter()
            self.opt.step()
            t2 = time.perf_counter()
        if record:
            self.times["step"].append(t2 - t0)
            self.times["forward_backward"].append(t1 - t0)
            self.times["optimizer"].append(t2 - t1)
            self.times["library"].append(sum(lib.seconds.values()))
            for k, v in lib.seconds.items():
                self.library_by_call.setdefault(k, []).append(v)
        return float(loss.detach())

    def medians_ms(self):
        out = {k: 1e3 * statistics.median(v) for k, v in self.times.items()}
        out["library_by_call"] = {k: 1e3 * statistics.median(v) for k, v in sorted(self.library_by_call.items())}
        return out


def bench_dim(D, steps, seed):
    I = D if D >= 512 else 2 * D  # the shapes: I = 1024 at D = 1024, 512 at D = 256
    x = torch.randn(TOKENS, D, generator=torch.Generator().manual_seed(seed))
    y = torch.randint(0, VOCAB, (TOKENS,), generator=torch.Generator().manual_seed(seed + 1))
    runs = [Run("bf16", D, I, seed), Run("mxfp8", D, I, seed)]
    for r in runs:
        r.step(x, y, record=False)  # warm-up: lazy initialisation, first-touch page faults
    for _ in range(steps):
        for r in runs:
            r.step(x, y)
    res = {r.name: r.medians_ms() for r in runs}
    res["ratio_bf16_over_mxfp8"] = res["bf16"]["step"] / res["mxfp8"]["step"]
    res["shape"] = {"D": D, "tokens": TOKENS, "experts": EXPERTS, "top_k": TOP_K, "I": I, "block_size": BLOCK}
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dims", default="1024,256", help="comma-separated model widths D (default 1024,256)")
    p.add_argument("--steps", type=int, default=6, help="timed steps per model and width (default 6)")
    p.add_argument("--threads", type=int, default=2, help="torch and mxfp8 threads (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    a = p.parse_args(argv)
    dims = [int(d) for d in a.dims.split(",") if d]
    if not dims or min(dims) < 8 or a.steps < 1 or a.threads < 1:
        p.error("--dims takes widths >= 8, --steps and --threads >= 1")
    torch.set_num_threads(a.threads)
    mxfp8.set_num_threads(a.threads)
    info = mxfp8.info()
    print(f"train_step: {TOKENS} tokens, E={EXPERTS} top-{TOP_K}, block {BLOCK}, {a.threads} threads, "
          f"mxfp8 isa {info['isa']}, torch {torch.__version__}; medians of {a.steps} interleaved steps")
    out = {"threads": a.threads, "steps": a.steps, "isa": info["isa"], "torch": torch.__version__, "dims": {}}
    for D in dims:
        r = bench_dim(D, a.steps, a.seed)
        out["dims"][str(D)] = r
        b, m = r["bf16"], r["mxfp8"]
        print(f"D={D} I={r['shape']['I']}: bf16 step {b['step']:.1f} ms, mxfp8 step {m['step']:.1f} ms, "
              f"ratio bf16/mxfp8 {r['ratio_bf16_over_mxfp8']:.3f}")
        print(f"  bf16:  forward+backward {b['forward_backward']:.1f} ms, optimizer {b['optimizer']:.1f} ms")
        print(f"  mxfp8: forward+backward {m['forward_backward']:.1f} ms (library calls {m['library']:.1f} ms, "
              f"torch ops and mxfp8.torch glue {m['forward_backward'] - m['library']:.1f} ms), "
              f"optimizer {m['optimizer']:.1f} ms")
        for name, ms in sorted(m["library_by_call"].items(), key=lambda kv: -kv[1]):
            print(f"    {name:28s} {ms:8.2f} ms")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {a.json}")
    return out


if __name__ == "__main__":
    main()
