"""One rank of the mxfp8.mpi tests, started by test_mpi.py under mpirun (not a pytest module).

    mpirun -np P python mpi_worker.py bitwise   every case: the expert-parallel forward / backward on this rank's
                                                slice equal, bit for bit, to the single-process mxfp8 layer of the
                                                gathered problem (the oracle), computed on every rank
    mpirun -np P python mpi_worker.py fault     a bad argument on one rank: every rank raises the same MXFP8Error
                                                (status and message naming the rank) within a time limit

Prints "rank R: ok ..." lines and exits 0 when every check passed, 1 otherwise.
"""

import os
import sys
import time

import ml_dtypes
import numpy as np

try:
    import mxfp8
except ImportError:  # the source tree, as conftest.py does
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                    "python"))
    import mxfp8
from mpi4py import MPI

import mxfp8.mpi as ep

COMM = MPI.COMM_WORLD
RANK, P = COMM.Get_rank(), COMM.Get_size()
BF16 = np.dtype(ml_dtypes.bfloat16)
FAILS = []


def check(ok, what):
    if not ok:
        FAILS.append(what)
        print(f"rank {RANK}: FAIL {what}", flush=True)


def bits(a):
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def same(got, want, what):
    check(got.shape == want.shape and got.dtype == want.dtype and np.array_equal(bits(got), bits(want)),
          f"{what}: differs from the single-process result")


def tokens(kind):
    uneven = [11, 0, 23, 6]
    if kind == "uneven":
        return [uneven[r % 4] for r in range(P)]
    return [0] * (P - 1) + [30]  # everything on the last rank


def problem(seed, E, K, H, I, kind, xdt, empty_expert=-1):
    g = np.random.default_rng(seed)
    counts = tokens(kind)
    off = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    T = int(off[-1])
    # magnitudes spread over 2^-6 .. 2^2, so that MX groups along H and along the positions get different scales
    # (with one binade the MXFP8 wire's round trip would be invisible: the kernels re-quantize with the same scale)
    X = (g.uniform(0, 1, (T, H)) * 2.0 ** g.integers(-6, 3, (T, H))).astype(np.float32).astype(xdt)
    dY = (g.uniform(-1, 1, (T, H)) * 2.0 ** g.integers(-6, 3, (T, H))).astype(np.float32).astype(xdt)
    experts = [e for e in range(E) if e != empty_expert]
    ids = np.array([g.choice(experts, K, replace=False) for _ in range(T)], np.int32).reshape(T, K)
    wts = g.uniform(0.05, 1, (T, K)).astype(np.float32)
    W1 = g.uniform(-0.1, 0.1, (E, H, 2, I)).astype(np.float32)
    W2 = g.uniform(-0.1, 0.1, (E, I, H)).astype(np.float32)
    b1 = g.uniform(-0.3, 0.3, (E, 2, I)).astype(np.float32)
    b2 = g.uniform(-0.3, 0.3, (E, H)).astype(np.float32)
    return dict(off=off, T=T, X=X, dY=dY, ids=ids, wts=wts, W1=W1, W2=W2, b1=b1, b2=b2)


def round_trip(x, cfg):
    fmt = "e5m2" if cfg.fp8_x4_dtype == "float8_e5m2" else "e4m3"
    d, s = mxfp8.quantize(x, fmt=fmt, axis=-1, scale_rule=cfg.scale_rule)
    return mxfp8.dequantize(d, s, axis=-1, out_dtype="float32")


def run_case(name, seed, E=6, K=2, H=64, I=32, B=8, kind="uneven", xdt=BF16, wire="native", keep=True,
             by_aff=False, empty_expert=-1, **cfg_kw):
    cfg = mxfp8.MXFP8MOEBwdConfig(**cfg_kw)
    pr = problem(seed, E, K, H, I, kind, xdt, empty_expert)
    T = pr["T"]
    bias = dict(gate_and_up_proj_bias=pr["b1"], down_proj_bias=pr["b2"]) if cfg.bias else {}
    # the oracle: the single-process layer on the gathered problem
    tp, be, a = mxfp8.route(pr["ids"], pr["wts"], E, B, padding_id=cfg.padding_id(T))
    Xo = round_trip(pr["X"], cfg) if wire == "mxfp8" else pr["X"]
    dYo = round_trip(pr["dY"], cfg) if wire == "mxfp8" else pr["dY"]
    y_ref, cks = mxfp8.blockwise_mm_fwd_mxfp8(Xo, a, pr["W1"], pr["W2"], tp, be, B, cfg, output_dtype=xdt,
                                              checkpoints=("gate_up_proj_act_checkpoint_T",
                                                           "down_proj_output_checkpoint"), **bias)
    if not keep or cfg.affinity_option != "affinity_on_h":
        cks.pop("down_proj_output_checkpoint")
    if not keep:
        cks = {}
    g_ref = mxfp8.blockwise_mm_bwd_mxfp8(Xo, a, pr["W1"], pr["W2"], tp, be, dYo, B, config=cfg, grad_dtype=xdt,
                                         **cks, **bias)
    # this rank's slice, expert parallel
    o0, o1 = pr["off"][RANK], pr["off"][RANK + 1]
    e0, Er = ep.expert_range(E, COMM)
    sl = slice(e0, e0 + Er)
    lb = dict(gate_and_up_proj_bias=pr["b1"][sl], down_proj_bias=pr["b2"][sl]) if cfg.bias else {}
    route = dict(expert_affinities_masked=a.reshape(T, E)[o0:o1].reshape(-1, 1)) if by_aff else \
        dict(topk_ids=pr["ids"][o0:o1], topk_weights=pr["wts"][o0:o1])
    y, ctx = ep.moe_forward(pr["X"][o0:o1], pr["W1"][sl], pr["W2"][sl], E, block_size=B, config=cfg, comm=COMM,
                            wire=wire, keep_checkpoints=keep, **route, **lb)
    same(y, y_ref[o0:o1], f"[{name}] output")
    grads = ep.moe_backward(ctx, pr["dY"][o0:o1], pr["W1"][sl], pr["W2"][sl], **lb)
    same(grads[0], g_ref[0][o0:o1], f"[{name}] hidden_states_grad")
    da = g_ref[1].reshape(T, E)
    if by_aff:
        same(grads[1], da[o0:o1].reshape(-1, 1), f"[{name}] expert_affinities_masked_grad")
    else:
        same(grads[1], np.take_along_axis(da, pr["ids"].astype(np.int64), 1)[o0:o1], f"[{name}] topk_weights_grad")
    for k, nm in ((2, "gate_up_proj_weight_grad"), (3, "down_proj_weight_grad")):
        same(grads[k], g_ref[k][sl], f"[{name}] {nm}")
    if cfg.bias:
        same(grads[4], g_ref[4][sl], f"[{name}] gate_and_up_proj_bias_grad")
        same(grads[5], g_ref[5][sl], f"[{name}] down_proj_bias_grad")
    check(ctx.nbytes > 0 and ctx.forward_stats["local_pairs"] == ctx.backward_stats["local_pairs"],
          f"[{name}] context stats")
    ctx.close()
    if RANK == 0:
        print(f"ok P={P} {name}", flush=True)


def bitwise():
    run_case("top2 bf16", 1)
    run_case("top1 f32 mxfp8-wire, an expert without tokens, recompute", 2, K=1, H=80, I=48, B=4, xdt=np.float32,
             wire="mxfp8", keep=False, empty_expert=3)
    run_case("top4 on_h bias clamps, padding id T", 3, K=4, B=16, affinity_option="affinity_on_h", bias=True,
             activation_type="swish", clamp_limits=mxfp8.ClampLimits(0.4, -0.4, 0.5, -2.0),
             skip_dma=mxfp8.SkipMode(skip_token=False), fp8_x4_dtype="float8_e5m2", scale_rule="ocp")
    run_case("routed by affinities, f16 mxfp8-wire", 4, K=3, H=96, xdt=np.float16, wire="mxfp8", by_aff=True,
             scale_rule="rceil")
    run_case("all tokens on the last rank", 5, kind="last", B=5)


def fault():
    pr = problem(9, 6, 2, 64, 32, "uneven", BF16)
    o0, o1 = pr["off"][RANK], pr["off"][RANK + 1]
    e0, Er = ep.expert_range(6, COMM)
    ids = pr["ids"][o0:o1].copy()
    bad = P - 1
    if RANK == bad and len(ids):
        ids[0, 0] = 6  # out of range
    W1 = pr["W1"][e0:e0 + Er]
    if RANK == bad and not len(ids):
        W1 = pr["W1"][e0:e0 + Er + 1] if e0 + Er < 6 else pr["W1"][e0:e0 + Er - 1]  # wrong expert count
    t0 = time.time()
    err = None
    try:
        ep.moe_forward(pr["X"][o0:o1], W1, pr["W2"][e0:e0 + Er], 6, ids, pr["wts"][o0:o1], block_size=8, comm=COMM)
    except mxfp8.MXFP8Error as e:
        err = e
    dt = time.time() - t0
    check(err is not None, "no error raised")
    msgs = COMM.allgather((err.status, err.message) if err else None)
    check(all(m == msgs[0] for m in msgs), f"ranks disagree: {msgs}")
    check(err is not None and f"rank {bad} of {P}" in err.message, f"message does not name rank {bad}: {err}")
    check(dt < 20, f"took {dt:.1f} s")
    if RANK == 0:
        print(f"ok P={P} fault on rank {bad}: {err}", flush=True)
    # a 3-D hidden_states on one rank: the library's check, agreed by every rank (no rank raises alone)
    err = None
    X = pr["X"][o0:o1]
    try:
        ep.moe_forward(X[None] if RANK == bad else X, pr["W1"][e0:e0 + Er], pr["W2"][e0:e0 + Er], 6,
                       pr["ids"][o0:o1], pr["wts"][o0:o1], block_size=8, comm=COMM)
    except mxfp8.MXFP8Error as e:
        err = e
    msgs = COMM.allgather((err.status, err.message) if err else None)
    check(all(m == msgs[0] for m in msgs) and err is not None and f"rank {bad} of {P}" in err.message
          and "hidden_states must be 2-D" in err.message, f"3-D hidden_states: {msgs}")
    # stochastic rounding cannot give the single-process bits: refused on every rank, saying why
    err = None
    try:
        ep.moe_forward(pr["X"][o0:o1], pr["W1"][e0:e0 + Er], pr["W2"][e0:e0 + Er], 6, pr["ids"][o0:o1],
                       pr["wts"][o0:o1], block_size=8, comm=COMM,
                       config=mxfp8.MXFP8MOEBwdConfig(stochastic_rounding=["gemm1_x"]))
    except mxfp8.MXFP8Error as e:
        err = e
    check(err is not None and err.status_name == "MXFP8_ERR_UNSUPPORTED"
          and "not supported with expert parallelism" in err.message and "logical index" in err.message,
          f"stochastic rounding: {err}")
    if RANK == 0:
        print(f"ok P={P} stochastic rounding refused: {err}", flush=True)


if __name__ == "__main__":
    mxfp8.set_num_threads(1 + RANK % 2)
    {"bitwise": bitwise, "fault": fault}[sys.argv[1]]()
    n = COMM.allreduce(len(FAILS))
    if RANK == 0:
        print(f"mpi_worker {sys.argv[1]}: {'all checks passed' if not n else f'{n} checks FAILED'}", flush=True)
    sys.exit(1 if n else 0)
