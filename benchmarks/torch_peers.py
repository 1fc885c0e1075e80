#!/usr/bin/env python3
"""mxfp8.torch against what a PyTorch user has on a CPU, timed in one process (ratios of times measured in the same
run; absolute times on a shared machine drift by 10-30%).

    python benchmarks/torch_peers.py [--reps 5] [--full] [--threads N]

Peers:
  - torch bf16: F.linear / the MoE experts as a bf16 graph (tokens sorted by expert, then torch._grouped_mm, and a
    per-expert torch.mm loop; the faster of the two is the reference), no quantization;
  - torchao (only when `import torchao` works; it is not a dependency): its MXFP8 emulation on the CPU
    (KernelPreference.EMULATED, E4M3, RCEIL): to_mx, the MX linear (mx_mm) and the MX grouped mm.
Problems: quantize a 4096x4096 bf16 matrix (E4M3, RCEIL, along rows); linear Y = X @ W^T forward and forward +
backward at the (M, K, N) shapes of `mxfp8 bench` (4096^3 only with --full); the MoE experts at the problem of
the NKI kernel's test, as `mxfp8 bench` runs it (H=1024, T=1024 tokens, E=4 experts, top-4, I=256, block 512)
with routing given.
Ours uses recipe "mxfp8" (E4M3, RCEIL) for the linear layer, the torchao recipe, and "nki" (E4M3, NKI rule) for
the MoE experts; every input is bf16. ratio = peer time / mxfp8 time (> 1: mxfp8 is faster).
"""

import argparse
import os
import time

import torch
import torch.nn.functional as F

import mxfp8
import mxfp8.torch as mt


def best_ms(fn, reps):
    fn()  # warm-up (page faults, lazy initialisation)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def load_torchao():
    """(namespace of the torchao entry points, None) or (None, the reason it is not usable)."""
    try:
        from torchao.prototype.moe_training.mxfp8_grouped_mm import _to_mxfp8_then_scaled_grouped_mm
        from torchao.prototype.moe_training.mxfp8_linear import _to_mxfp8_then_scaled_mm
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.mx_tensor import to_mx
        from torchao.quantization.quantize_.common.kernel_preference import KernelPreference
        import torchao
    except Exception as e:  # not installed, or an API this script does not know
        return None, f"{type(e).__name__}: {e}"
    emu, rceil = KernelPreference.EMULATED, ScaleCalculationMode.RCEIL
    ns = dict(version=torchao.__version__,
              to_mx=lambda x: to_mx(x, torch.float8_e4m3fn, 32, rceil),
              linear=lambda x, w: _to_mxfp8_then_scaled_mm(x, w, emu, rceil),
              grouped=lambda a, b, offs: _to_mxfp8_then_scaled_grouped_mm(a, b, offs, kernel_preference=emu,
                                                                          scale_calculation_mode=rceil))
    return ns, None


def row(name, times, ours="mxfp8"):
    t = times[ours]
    cells = [f"{name:<28}"] + [f"{k} {v:9.2f} ms" for k, v in times.items()]
    ratios = [f"{k}/mxfp8 {v / t:5.2f}" for k, v in times.items() if k != ours]
    print("  " + "  ".join(cells) + "   " + "  ".join(ratios), flush=True)


def bench_quantize(ao, reps):
    x = torch.randn(4096, 4096, dtype=torch.bfloat16)
    times = {"mxfp8": best_ms(lambda: mt.quantize(x, torch.float8_e4m3fn, scale_rule="rceil"), reps)}
    if ao:
        times["torchao"] = best_ms(lambda: ao["to_mx"](x), reps)
    print("\nquantize: 4096x4096 bf16 -> E4M3 + E8M0 scales along rows (RCEIL)")
    row("4096x4096", times)


def bench_linear(ao, reps, full):
    shapes = [(512, 512, 512), (1024, 1024, 1024), (2048, 1024, 512), (512, 1024, 2048)]
    if full:
        shapes.append((4096, 4096, 4096))
    print("\nlinear: Y = X @ W^T, bf16 in and out; fwd = forward, fwd+bwd = forward + dX + dW")
    for M, K, N in shapes:
        x = torch.randn(M, K, dtype=torch.bfloat16, requires_grad=True)
        w = (torch.randn(N, K) * 0.05).to(torch.bfloat16).requires_grad_()
        dy = torch.randn(M, N, dtype=torch.bfloat16)
        fns = {"mxfp8": lambda a, b: mt.linear(a, b, recipe="mxfp8"), "bf16": F.linear}
        if ao:
            fns["torchao"] = ao["linear"]
        with torch.no_grad():
            fwd = {k: best_ms(lambda f=f: f(x, w), reps) for k, f in fns.items()}
        both = {k: best_ms(lambda f=f: f(x, w).backward(dy), reps) for k, f in fns.items()}
        row(f"({M}, {K}, {N}) fwd", fwd)
        row(f"({M}, {K}, {N}) fwd+bwd", both)


def _moe_problem(H=1024, T=1024, E=4, K=4, I=256, B=512):
    g = torch.Generator().manual_seed(0)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    w = torch.rand(T, K, generator=g)
    w = w / w.sum(-1, keepdim=True)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    w1 = (torch.randn(E, H, 2, I, generator=g) * H ** -0.5).to(torch.bfloat16)
    w2 = (torch.randn(E, I, H, generator=g) * I ** -0.5).to(torch.bfloat16)
    return dict(ids=ids, w=w, x=x, w1=w1, w2=w2, E=E, B=B, H=H, I=I, K=K)


def _graph(p, mm):
    """The experts as a torch graph: tokens sorted by expert, two grouped GEMMs `mm(a, b [E, K, N], offs)`,
    SwiGLU, affinity weighting, scatter-add back to the tokens."""
    E, H, I, K = p["E"], p["H"], p["I"], p["K"]
    order = torch.argsort(p["ids"].reshape(-1), stable=True)
    tok = order // K
    counts = torch.bincount(p["ids"].reshape(-1), minlength=E)
    offs = torch.cumsum(counts, 0).to(torch.int32)
    wsorted = p["w"].reshape(-1)[order, None]

    def run(x, w1, w2):
        gu = mm(x[tok], w1.reshape(E, H, 2 * I), offs)
        h = F.silu(gu[:, :I]) * gu[:, I:]
        y = mm(h, w2, offs) * wsorted
        return torch.zeros_like(x).index_add(0, tok, y.to(x.dtype))
    return run


def _loop_mm(a, b, offs):
    outs, start = [], 0
    for e, end in enumerate(offs.tolist()):
        outs.append(a[start:end] @ b[e])
        start = end
    return torch.cat(outs)


def bench_moe(ao, reps):
    p = _moe_problem()
    tp, be, a = mt.route(p["ids"], p["w"], p["E"], p["B"])
    leaves = [t.clone().requires_grad_() for t in (p["x"], p["w1"], p["w2"])]
    dy = torch.randn(p["x"].shape, dtype=torch.bfloat16)

    def ours(x, w1, w2):
        return mt.moe(x, a, w1, w2, tp, be, p["B"], recipe="nki")
    fns = {"mxfp8": ours, "bf16 grouped_mm": _graph(p, lambda x, b, offs: torch._grouped_mm(x, b, offs=offs)),
           "bf16 mm loop": _graph(p, _loop_mm)}
    if ao:
        # torchao wants each expert's weight [K, N] column-major
        fns["torchao"] = _graph(p, lambda x, b, offs: ao["grouped"](x, b.transpose(-2, -1).contiguous()
                                                                    .transpose(-2, -1), offs))
    print(f"\nmoe experts: H={p['H']}, T={p['x'].shape[0]}, E={p['E']}, top-{p['K']}, I={p['I']}, block {p['B']}, "
          f"bf16, routing given")
    with torch.no_grad():
        fwd = {k: best_ms(lambda f=f: f(*leaves), reps) for k, f in fns.items()}
    both = {k: best_ms(lambda f=f: f(*leaves).backward(dy), reps) for k, f in fns.items()}
    row("fwd", fwd)
    row("fwd+bwd", both)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="timed runs per measurement (best is kept)")
    ap.add_argument("--threads", type=int, default=0, help="threads for torch and mxfp8 (default: all cores)")
    ap.add_argument("--full", action="store_true", help="also the 4096^3 linear layer")
    args = ap.parse_args()
    n = args.threads or os.cpu_count()
    torch.set_num_threads(n)
    mxfp8.set_num_threads(n)
    ao, why = load_torchao()
    inf = mxfp8.info()
    print(f"torch {torch.__version__}, mxfp8 {inf['version']} (ISA {inf['isa']}), {n} thread(s), best of "
          f"{args.reps} after a warm-up; torchao: {ao['version'] + ' (EMULATED)' if ao else 'not used: ' + why}")
    bench_quantize(ao, args.reps)
    bench_linear(ao, args.reps, args.full)
    bench_moe(ao, args.reps)


if __name__ == "__main__":
    main()
