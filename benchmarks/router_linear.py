#!/usr/bin/env python3
"""The batch-invariant router linear (mxfp8.torch.router_linear) against nn.Linear, timed in one process (ratios of
times measured in the same run, the two alternating; absolute times on a shared machine drift).

    python benchmarks/router_linear.py [--tokens 2048] [--hidden 1024] [--experts 8] [--threads 0] [--reps 7]

Per activation dtype: float32 (nn.Linear in FP32) and bfloat16 (nn.Linear under torch.autocast("cpu", bfloat16):
torch's bfloat16 GEMM, the usual mixed-precision router), each run does the forward and the backward (gradients of
the input, the weight and the bias, through torch.autograd.grad); the forward alone is timed too. Printed: the
median time of each and the median of the per-repetition ratios router_linear / nn.Linear (< 1: router_linear
faster). router_linear computes every logit as one FP32 fused multiply-add chain, the same bits for any batch split
and thread count; nn.Linear's bits depend on both.
"""

import argparse
import statistics
import time

import torch

import mxfp8
import mxfp8.torch as mt


def _time(fn, n):
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0, help="threads of torch and the library (0: their defaults)")
    ap.add_argument("--reps", type=int, default=7, help="repetitions (each times 10 calls of every variant)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
        mxfp8.set_num_threads(a.threads)
    torch.manual_seed(0)
    T, H, E = a.tokens, a.hidden, a.experts
    lin = torch.nn.Linear(H, E)
    g = torch.randn(T, E)
    print(f"T={T} H={H} E={E} threads: torch {torch.get_num_threads()}, mxfp8 {mxfp8.info()['num_threads']}")
    for dt in (torch.float32, torch.bfloat16):
        x = torch.randn(T, H).to(dt).requires_grad_()
        autocast = dt == torch.bfloat16
        params = (x, lin.weight, lin.bias)

        def ours():
            torch.autograd.grad(mt.router_linear(x, lin.weight, lin.bias), params, g)

        def theirs():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                y = lin(x)
            torch.autograd.grad(y, params, g.to(y.dtype))

        def ours_fwd():
            with torch.no_grad():
                mt.router_linear(x, lin.weight, lin.bias)

        def theirs_fwd():
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                lin(x)

        fns = (ours, theirs, ours_fwd, theirs_fwd)
        for f in fns:
            f(), f()
        times = [[] for _ in fns]
        for _ in range(a.reps):
            for i, f in enumerate(fns):
                times[i].append(_time(f, 10))
        med = [statistics.median(t) for t in times]
        r_all = statistics.median(o / t for o, t in zip(times[0], times[1]))
        r_fwd = statistics.median(o / t for o, t in zip(times[2], times[3]))
        name = "float32" if dt == torch.float32 else "bfloat16 (nn.Linear under autocast)"
        print(f"{name}: forward+backward {med[0]:.3f} ms vs nn.Linear {med[1]:.3f} ms, ratio {r_all:.2f}; "
              f"forward {med[2]:.3f} ms vs {med[3]:.3f} ms, ratio {r_fwd:.2f}")


if __name__ == "__main__":
    main()
