"""One rank of the mxfp8.torch expert-parallel tests, started by test_torch_ep.py (not a pytest module).

    python torch_ep_worker.py RANK WORLD STORE_FILE MODE [TIMEOUT_S]

joins a gloo group through a FileStore and runs MODE:
    all       bitwise, then module (one group for both)
    bitwise   every case: the expert-parallel layer on this rank's tokens and experts equal, bit for bit, to the
              single-process layer on the gathered batch (the oracle: mxfp8.torch.route + mxfp8.torch.moe, or a
              BlockwiseMoE holding all experts), computed on every rank
    module    the same for BlockwiseMoE(expert_parallel_group=...) against BlockwiseMoE, router included; then ckpt
    ckpt      checkpoints: gathered from the P ranks equal the single-process state dict; split back equal
    mismatch  a configuration differing on the last rank: every rank raises the same ExpertParallelError; then
              badinput
    badinput  a bad input on the last rank only: every rank raises the same ExpertParallelError
    crash     the last rank exits without calling the layer: the others get an error (the connection closes)
    hf        a transformers model's experts split by mxfp8.torch.hf.shard_experts against the unsplit model
    stall     the last rank stays alive but never calls the layer: the others get an error from the group's
              timeout (TIMEOUT_S) and print how long they waited

Prints "rank R: ok ..." or "rank R: FAIL ..." lines, "rank R: error <message>" for the fault modes, and exits 0 when
every check passed, 1 otherwise.
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

try:
    import mxfp8
except ImportError:  # the source tree, as conftest.py does
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                    "python"))
    import mxfp8  # noqa: F401
import mxfp8.torch as mt
from mxfp8.torch import expert_parallel as ep

RANK, P, STORE, MODE = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
TIMEOUT = float(sys.argv[5]) if len(sys.argv) > 5 else 120.0
FAILS = []


def say(msg):
    print(f"rank {RANK}: {msg}", flush=True)


def check(ok, what):
    if not ok:
        FAILS.append(what)
        say(f"FAIL {what}")


def bits(t):
    t = t.detach().contiguous()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def same(got, want, what):
    ok = got is not None and want is not None and got.shape == want.shape and got.dtype == want.dtype and \
        torch.equal(bits(got), bits(want))
    if not ok and got is not None and want is not None and got.shape == want.shape:
        d = (got.float() - want.float()).abs().max().item() if got.numel() else 0
        what = f"{what} (max |diff| {d:g}, dtypes {got.dtype} / {want.dtype})"
    check(ok, f"{what}: differs from the single-process result")


def counts_of(kind, T):
    """Tokens per rank: "uneven" (a rank with none when P > 1), "even", "last" (all on the last rank)."""
    if kind == "last":
        return [0] * (P - 1) + [T]
    if kind == "even":
        return [T // P + (r < T % P) for r in range(P)]
    w = [3, 0, 5, 1][:P] if P > 1 else [1]
    c = [T * x // sum(w) for x in w]
    c[-1] += T - sum(c)
    return c


def qdq(t, recipe):
    """The MX round trip of rows along H (what the MXFP8 wire does), in t's dtype."""
    r = mt.get_recipe(recipe)
    d, s = mt.quantize(t, r.moe_dtype, axis=-1, scale_rule=r.scale_rule)
    return mt.dequantize(d, s, axis=-1, output_dtype=torch.float32).to(t.dtype)


def rank_slice(counts):
    a = sum(counts[:RANK])
    return slice(a, a + counts[RANK])


# ---- bitwise: the functional layer against route + moe ----------------------------------------------------------
def functional_case(name, E, K, H=64, I=32, T=40, Bs=8, kind="uneven", dtype=torch.bfloat16, wire="native",
                    bias=False, empty_expert=None, activation="silu", affinity_option="affinity_on_i",
                    recipe="mxfp8", seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]) if T else \
        torch.zeros(0, K, dtype=torch.int64)
    if empty_expert is not None and T:  # no token chooses this expert
        for t in range(T):
            row = ids[t].tolist()
            if empty_expert in row:
                free = [e for e in range(E) if e not in row]
                row[row.index(empty_expert)] = free[0] if free[0] != empty_expert else free[1]
                ids[t] = torch.tensor(row)
    w = torch.softmax(torch.randn(T, K, generator=g), dim=-1)
    w1 = (torch.randn(E, H, 2, I, generator=g) / 8).to(dtype)
    w2 = (torch.randn(E, I, H, generator=g) / 6).to(dtype)
    b1 = (torch.randn(E, 2, I, generator=g) / 10).to(dtype) if bias else None
    b2 = (torch.randn(E, H, generator=g) / 10).to(dtype) if bias else None
    dy = torch.randn(T, H, generator=g).to(dtype)
    kw = dict(activation=activation, affinity_option=affinity_option, recipe=recipe)

    # the single-process oracle on the gathered batch (with the wire's round trip for "mxfp8")
    trip = (lambda t: qdq(t, recipe)) if wire == "mxfp8" else (lambda t: t.bfloat16().to(t.dtype)) \
        if wire == "bf16" else (lambda t: t)  # what the wire does to the rows
    xr = trip(x).clone().requires_grad_()
    wr = w.clone().requires_grad_()
    params = [t.clone().requires_grad_() if t is not None else None for t in (w1, w2, b1, b2)]
    tp, be, a = mt.route(ids, wr, E, Bs)
    yr = mt.moe(xr, a, params[0], params[1], tp, be, Bs, gate_and_up_proj_bias=params[2],
                down_proj_bias=params[3], **kw)
    yr.backward(trip(dy))

    counts = counts_of(kind, T)
    sl = rank_slice(counts)
    e0, n = ep.expert_range(E, P, RANK)
    es = slice(e0, e0 + n)
    xe = x[sl].clone().requires_grad_()
    we = w[sl].clone().requires_grad_()
    lp = [t[es].clone().requires_grad_() if t is not None else None for t in (w1, w2, b1, b2)]
    stats = {}
    ye = ep.expert_parallel_moe(xe, ids[sl], we, lp[0], lp[1], E, dist.group.WORLD, block_size=Bs, wire=wire,
                                gate_and_up_proj_bias=lp[2], down_proj_bias=lp[3], stats=stats, **kw)
    ye.backward(dy[sl])
    same(ye, yr[sl].detach(), f"{name}: output")
    same(xe.grad, xr.grad[sl], f"{name}: hidden_states grad")
    same(we.grad, wr.grad[sl], f"{name}: topk_weights grad")
    for nm, got, ref in zip(("gate_up_proj_weight", "down_proj_weight", "gate_and_up_proj_bias", "down_proj_bias"),
                            lp, params):
        if ref is not None:
            same(got.grad, ref.grad[es], f"{name}: {nm} grad")
    # the bytes sent to other ranks: a row per (token, other rank owning one of its experts), a 12-byte record and
    # an FP32 result row per (token, expert of another rank) -- libmxfp8_mpi's traffic, which its bench models
    owners = [next(q for q in range(P) if ep.expert_range(E, P, q)[0] <= e < sum(ep.expert_range(E, P, q)))
              for e in range(E)]
    rows = sum(len({owners[e] for e in ids[t].tolist()} - {RANK}) for t in range(sl.start, sl.stop))
    pairs = sum(owners[e] != RANK for t in range(sl.start, sl.stop) for e in ids[t].tolist())
    rb = H + (H + 31) // 32 if wire == "mxfp8" else 2 * H if wire == "bf16" else H * x.element_size()
    want = dict(counts_bytes_sent=16 * (P - 1), dispatch_bytes_sent=rows * rb + 12 * pairs,
                combine_bytes_received=4 * H * pairs, backward_dispatch_bytes_sent=rows * rb,
                backward_combine_bytes_received=4 * (H + 1) * pairs)
    got = {k: stats.get(k) for k in want}
    check(got == want, f"{name}: bytes moved {got}, expected {want}")
    if not FAILS:
        say(f"ok {name}")


def mode_bitwise():
    functional_case("top2 bf16 native", E=6, K=2)
    functional_case("top2 bf16 mxfp8 wire", E=6, K=2, wire="mxfp8")
    # the "ocp" recipe's weight gradients see the wire's round trip (with "mxfp8" / "nki" it happens to vanish)
    functional_case("top3 ocp mxfp8 wire", E=5, K=3, wire="mxfp8", recipe="ocp")
    functional_case("top1", E=5, K=1, kind="even")
    functional_case("top4 empty expert", E=6, K=4, empty_expert=2, kind="uneven")
    functional_case("top4 mxfp8 all on one rank", E=6, K=4, kind="last", wire="mxfp8", recipe="nki")
    functional_case("bias fp32 affinity_on_h", E=4, K=2, bias=True, dtype=torch.float32,
                    affinity_option="affinity_on_h", activation="swish")
    functional_case("fp32 top3 (the combine's summation order shows)", E=6, K=3, dtype=torch.float32, T=48)
    functional_case("fp32 rows on a bf16 wire", E=4, K=2, dtype=torch.float32, wire="bf16")
    functional_case("no tokens anywhere", E=4, K=2, T=0)
    functional_case("block size 1, 3 blocks per expert", E=4, K=3, T=23, Bs=1, wire="mxfp8")


# ---- module: BlockwiseMoE(expert_parallel_group=...) against BlockwiseMoE ----------------------------------------
def module_case(name, E, K, H=64, I=32, T=36, Bs=8, kind="uneven", wire="native", dtype=torch.bfloat16, seed=1,
                **kw):
    torch.manual_seed(seed)
    full = mt.BlockwiseMoE(H, I, E, K, block_size=Bs, output_router_logits=True, batch_invariant_router=True,
                           dtype=dtype, **kw)
    moe = mt.BlockwiseMoE(H, I, E, K, block_size=Bs, output_router_logits=True, dtype=dtype,
                          expert_parallel_group=dist.group.WORLD, expert_parallel_wire=wire, **kw)
    g = torch.Generator().manual_seed(seed + 100)
    if full.e_score_correction_bias is not None:  # DeepSeek-V3's bias of the choice, set by the training loop
        full.e_score_correction_bias.copy_(torch.randn(E, generator=g) / 4)
    moe.load_state_dict(ep.split_experts_state_dict(moe, full.state_dict()))
    x = torch.randn(T, H, generator=g).to(dtype)
    dy = torch.randn(T, H, generator=g).to(dtype)
    counts = counts_of(kind, T)
    sl = rank_slice(counts)
    e0, n = moe.expert_range
    es = slice(e0, e0 + n)

    xe = x[sl].clone().requires_grad_()
    ye, le = moe(xe)
    le.retain_grad()
    (ye.float() * dy[sl].float()).sum().backward()
    if wire == "native":  # the same module on the gathered batch
        xr = x.clone().requires_grad_()
        yr, lr = full(xr)
        lr.retain_grad()
        (yr.float() * dy.float()).sum().backward()
        same(ye, yr[sl].detach(), f"{name}: output")
        same(xe.grad, xr.grad[sl], f"{name}: hidden_states grad")
        same(le.grad, lr.grad[sl], f"{name}: router logits grad")
        same(le, lr[sl].detach(), f"{name}: router logits")
    else:  # the wire's round trip on the expert inputs and the output gradient: built from the module's own parts
        xr = x.clone().requires_grad_()
        ids, w, lr = full._route(full._router_logits(xr))
        lr.retain_grad()
        xq = (qdq(xr.detach(), full.recipe) - xr.detach()) + xr    # straight through the round trip
        tp, be, a = mt.route(ids, w, E, Bs)
        yr = mt.moe(xq, a, full.gate_up_proj_weight, full.down_proj_weight, tp, be, Bs, recipe=full.recipe,
                    activation=full.activation)
        # dL/dy = dy; the wire rounds the output gradient rows before they reach the experts
        yr.backward(qdq(dy.float().to(dtype), full.recipe))
        same(ye, yr[sl].detach(), f"{name}: output")
        same(le.grad, lr.grad[sl], f"{name}: router logits grad")
    for nm in ep.EXPERT_PARAMETERS:
        if getattr(full, nm) is not None:
            same(getattr(moe, nm).grad, getattr(full, nm).grad[es], f"{name}: {nm} grad")
    # the router weight's gradient: a data-parallel sum over the ranks (its bits depend on the split)
    gw = moe.router.weight.grad.clone()
    dist.all_reduce(gw)
    ref = full.router.weight.grad.float()
    tol = ref.abs().max().item() * P * 2.0 ** -7  # P partial sums, each rounded to the parameter's BF16
    check(bool(((gw.float() - ref).abs() <= tol).all()),
          f"{name}: router weight grad (summed over ranks) is not the single-process one")
    if not FAILS:
        say(f"ok {name}")


def ddp_case():
    """DistributedDataParallel over a group of its own, the expert parameters left out, beside the layer's group:
    the dense gradients are DDP's averages (all_reduce_dense_gradients(average=True) gives the same values), the
    expert gradients those of the model without DDP."""
    torch.manual_seed(5)
    E, H, I, T = 5, 32, 16, 12
    full = torch.nn.Sequential(torch.nn.Linear(H, H), mt.BlockwiseMoE(H, I, E, 2))
    sd = full.state_dict()

    def build():
        m = torch.nn.Sequential(torch.nn.Linear(H, H), mt.BlockwiseMoE(H, I, E, 2,
                                                                       expert_parallel_group=dist.group.WORLD))
        m.load_state_dict(ep.split_experts_state_dict(m, sd))
        return m
    g = torch.Generator().manual_seed(6 + RANK)
    x = torch.randn(T, H, generator=g)
    plain, wrapped = build(), build()
    plain(x).pow(2).sum().backward()
    ep.all_reduce_dense_gradients(plain, average=True)
    torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        wrapped, ep.expert_parameter_names(wrapped))
    ddp = torch.nn.parallel.DistributedDataParallel(wrapped, process_group=dist.new_group(backend="gloo"))
    ddp(x).pow(2).sum().backward()
    for (n, a), (_, b) in zip(plain.named_parameters(), wrapped.named_parameters()):
        if n in ep.expert_parameter_names(plain):
            same(b.grad, a.grad, f"ddp: {n} grad")
        else:
            check(torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-6), f"ddp: {n} grad differs from the helper's")
    if not FAILS:
        say("ok module ddp")


def mode_module():
    module_case("module top2", E=6, K=2)
    module_case("module top1 even", E=5, K=1, kind="even")
    module_case("module top4 mxfp8 wire", E=6, K=4, wire="mxfp8")
    module_case("module all tokens on the last rank", E=4, K=2, kind="last")
    module_case("module sigmoid router, expert groups, biases", E=6, K=2, score_func="sigmoid",
                score_correction_bias=True, n_group=3, topk_group=2, routed_scaling_factor=2.5, bias=True,
                router_bias=True)
    ddp_case()
    mode_ckpt()


# ---- checkpoints --------------------------------------------------------------------------------------------------
def mode_ckpt():
    torch.manual_seed(3)
    E, H, I = 5, 32, 16
    full = torch.nn.Sequential(torch.nn.Linear(H, H), mt.BlockwiseMoE(H, I, E, 2, bias=True))
    sd = full.state_dict()
    model = torch.nn.Sequential(torch.nn.Linear(H, H),
                                mt.BlockwiseMoE(H, I, E, 2, bias=True, expert_parallel_group=dist.group.WORLD))
    model.load_state_dict(ep.split_experts_state_dict(model, sd))
    e0, n = model[1].expert_range
    same(model[1].down_proj_bias.data, sd["1.down_proj_bias"][e0:e0 + n], "ckpt: split")
    back = ep.gather_experts_state_dict(model)
    check(set(back) == set(sd), "ckpt: gathered keys differ")
    for k in sd:
        same(back[k], sd[k], f"ckpt: gathered {k}")
    torch.manual_seed(3)  # the same seed: each rank's experts are the single-process layer's
    seeded = torch.nn.Sequential(torch.nn.Linear(H, H),
                                 mt.BlockwiseMoE(H, I, E, 2, bias=True, expert_parallel_group=dist.group.WORLD))
    for k, v in ep.split_experts_state_dict(seeded, sd).items():
        same(seeded.state_dict()[k], v, f"ckpt: seeded {k}")
    names = ep.expert_parameter_names(model)
    check(names == ["1.gate_up_proj_weight", "1.down_proj_weight", "1.gate_and_up_proj_bias", "1.down_proj_bias"],
          f"ckpt: expert_parameter_names {names}")
    one = torch.nn.Sequential(torch.nn.Linear(H, H), mt.BlockwiseMoE(H, I, E, 2, bias=True))
    one.load_state_dict(back)  # P ranks -> one process
    same(one[1].gate_up_proj_weight.data, full[1].gate_up_proj_weight.data, "ckpt: loaded into one process")
    # weights in the Mixtral layout, all E experts: each rank copies its own
    w1, w3, w2 = torch.randn(E, I, H), torch.randn(E, I, H), torch.randn(E, H, I)
    rw = torch.randn(E, H)
    model[1].load_mixtral_weights(rw, w1, w3, w2)
    one[1].load_mixtral_weights(rw, w1, w3, w2)
    same(model[1].down_proj_weight.data, one[1].down_proj_weight.data[e0:e0 + n], "ckpt: load_mixtral_weights")
    same(model[1].gate_up_proj_weight.data, one[1].gate_up_proj_weight.data[e0:e0 + n], "ckpt: load_mixtral_weights")
    if not FAILS:
        say("ok ckpt")


# ---- faults -------------------------------------------------------------------------------------------------------
def report(fn):
    try:
        fn()
    except ep.ExpertParallelError as e:
        say(f"error {e}")
        return
    except Exception as e:  # noqa: BLE001
        say(f"other error {type(e).__name__}: {e}")
        return
    say("no error")


def mode_mismatch():
    last = RANK == P - 1
    report(lambda: mt.BlockwiseMoE(32, 16 if not last else 24, 4, 2, expert_parallel_group=dist.group.WORLD))
    report(lambda: mt.BlockwiseMoE(32, 16, 4, 2, block_size=8 if not last else 16,
                                   expert_parallel_group=dist.group.WORLD))
    report(lambda: mt.BlockwiseMoE(32, 16, 4, 2, expert_parallel_group=dist.group.WORLD,
                                   expert_parallel_wire="mxfp8" if last else "native"))
    report(lambda: mt.BlockwiseMoE(32, 16, 4, 2 if not last else 9, expert_parallel_group=dist.group.WORLD))
    moe = mt.BlockwiseMoE(32, 16, 4, 2, expert_parallel_group=dist.group.WORLD)
    moe.top_k = 3 if last else 2  # changed after construction: caught at the forward
    report(lambda: moe(torch.randn(5, 32)))


def mode_badinput():
    moe = mt.BlockwiseMoE(32, 16, 4, 2, expert_parallel_group=dist.group.WORLD)
    H = 31 if RANK == P - 1 else 32
    report(lambda: moe(torch.randn(5, H)))
    x = torch.randn(5, 32, dtype=torch.float32 if RANK == P - 1 else torch.bfloat16)
    report(lambda: moe(x))
    report(lambda: mt.BlockwiseMoE(32, 16, 4, 2, expert_parallel_group=dist.group.WORLD,
                                   expert_parallel_wire="fp4"))
    report(lambda: mt.BlockwiseMoE(32, 16, 4, 2, expert_parallel_group=dist.group.WORLD, stochastic_rounding="all"))
    report(lambda: mt.BlockwiseMoE(32, 16, P - 1 or 1, 1, expert_parallel_group=dist.group.WORLD))
    y = moe(torch.randn(4, 32))  # the layer still works after agreed errors
    check(y.shape == (4, 32), "badinput: the layer after the errors")


def mode_crash():
    moe = mt.BlockwiseMoE(32, 16, 4, 2, expert_parallel_group=dist.group.WORLD)
    if RANK == P - 1:
        say("leaving")
        os._exit(0)  # no forward, no goodbye
    report(lambda: moe(torch.randn(5, 32)))


def mode_stall():
    moe = mt.BlockwiseMoE(32, 16, 4, 2, expert_parallel_group=dist.group.WORLD)
    if RANK == P - 1:  # alive but elsewhere (e.g. an exception caught by the training loop): never calls the layer
        say("stalling")
        end = time.monotonic() + 4 * TIMEOUT
        while time.monotonic() < end and not os.path.exists(STORE + ".done"):
            time.sleep(0.2)
        os._exit(0)
    t0 = time.monotonic()
    report(lambda: moe(torch.randn(5, 32)))
    say(f"waited {time.monotonic() - t0:.1f} s")
    open(STORE + ".done", "w").close()  # the stalled rank may leave now
    os._exit(0)


# ---- hf: a transformers model's experts split by mxfp8.torch.hf.shard_experts ----------------------------------
def mode_hf():
    """The experts of a tiny Mixtral (concatenated layout) and gpt-oss (interleaved, transposed, biases) model split
    over the group: each rank's tokens through its experts module equal, bit for bit, the unsplit module on the
    gathered batch with the same routing (output, input and routing-weight gradients, the rank's expert gradients)."""
    import warnings
    import mxfp8.torch.hf as mhf
    from test_torch_hf import BS, tiny_model
    for family in ("mixtral", "gpt_oss"):
        full, sharded = tiny_model(family), tiny_model(family)  # the same seed: the same parameters on every rank
        full.set_experts_implementation("mxfp8")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mhf.configure(full, block_size=BS)
            mhf.configure(sharded, block_size=BS)
        names = mhf.shard_experts(sharded, dist.group.WORLD)
        check(len(names) == 2, f"hf {family}: {len(names)} experts modules sharded, expected 2")
        ref, mod = full.get_submodule(names[0]), sharded.get_submodule(names[0])
        E = ref.gate_up_proj.shape[0]
        e0, n = ep.expert_range(E, P, RANK)
        check(mod.gate_up_proj.shape[0] == n, f"hf {family}: rank holds {mod.gate_up_proj.shape[0]} experts")
        T, H, K = 37, ref.gate_up_proj.shape[2] if not ref.is_transposed else ref.gate_up_proj.shape[1], 2
        g = torch.Generator().manual_seed(7)
        x = torch.randn(T, H, generator=g)
        ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
        w = torch.softmax(torch.randn(T, K, generator=g), dim=-1)
        dy = torch.randn(T, H, generator=g)
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        yr = ref(xr, ids, wr)
        yr.backward(dy)
        sl = rank_slice(counts_of("uneven", T))
        xe, we = x[sl].clone().requires_grad_(), w[sl].clone().requires_grad_()
        ye = mod(xe, ids[sl], we)
        ye.backward(dy[sl])
        same(ye, yr[sl].detach(), f"hf {family}: output")
        same(xe.grad, xr.grad[sl], f"hf {family}: hidden_states grad")
        same(we.grad, wr.grad[sl], f"hf {family}: top_k_weights grad")
        for pname in ("gate_up_proj", "down_proj") + (("gate_up_proj_bias", "down_proj_bias") if ref.has_bias
                                                       else ()):
            same(getattr(mod, pname).grad, getattr(ref, pname).grad[e0:e0 + n], f"hf {family}: {pname} grad")
    say("ok hf")


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(STORE, P), rank=RANK, world_size=P,
                            timeout=datetime.timedelta(seconds=TIMEOUT))
    {"all": lambda: (mode_bitwise(), mode_module()), "bitwise": mode_bitwise, "module": mode_module,
     "ckpt": mode_ckpt, "mismatch": lambda: (mode_mismatch(), mode_badinput()),
     "badinput": mode_badinput, "crash": mode_crash,
     "stall": mode_stall, "hf": mode_hf}[MODE]()
    if MODE != "crash":
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
