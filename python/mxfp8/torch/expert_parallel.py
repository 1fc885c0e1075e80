"""Expert parallelism of the blockwise MXFP8 MoE layer over a torch.distributed process group (gloo on the CPU).

    import datetime
    import torch.distributed as dist
    import mxfp8.torch as mt
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=5))    # e.g. under torchrun
    moe = mt.BlockwiseMoE(H, I, E, top_k, expert_parallel_group=dist.group.WORLD)   # this rank's experts only
    y = moe(x_of_this_rank)            # collective: every rank of the group calls it, in the same order
    y.sum().backward()                 # collective too
    mt.expert_parallel.all_reduce_dense_gradients(model)   # data parallelism of everything but the experts
    ...
    dist.destroy_process_group()       # before the process exits (gloo's threads must not outlive the interpreter)

Placement: the E experts are split into contiguous ranges over the P ranks of the group, as even as possible (the
first E % P ranks get one more: expert_range, the rule of mxfp8.mpi.expert_range); P <= E. Each rank holds the
parameters of its own experts ([E_local, ...]); the router and any shared experts are replicated (data-parallel) and
computed on the rank's own tokens, which never leave their rank except as rows sent to the experts' owners.

Data flow of one forward (each step the mirror of libmxfp8_mpi's mxfp8_mpi_moe_forward):
  1. agreement: every rank checks its inputs and its layer configuration locally, then one all_gather_object shares
     (error or None, configuration) so that a bad input or a configuration that differs between ranks raises the
     same ExpertParallelError on every rank, naming the rank and the field, before any exchange;
  2. dispatch: each token row goes once to every rank owning one of its experts (all_to_all_single of bytes: the rows
     in their own dtype, wire="native"; rounded to BF16, wire="bf16"; or MXFP8 codes + E8M0 scales, wire="mxfp8"),
     with one (row, expert, weight) record per (token, expert) pair;
  3. local layer: the owner places each pair in its own "pair-row" and forms its experts' blocks exactly as
     mxfp8.torch.route does for the gathered batch (all ranks' tokens concatenated in rank order): expert-major,
     tokens in ascending global order, ceil(count / block_size) blocks per expert, so that every block holds the rows
     of the gathered problem's block; the mxfp8::moe op computes each pair's result in FP32;
  4. combine: the FP32 pair results return to the token's rank (all_to_all_single), where each token's pairs are
     summed in ascending expert order from +0 in FP32 and rounded once to the input dtype -- the order and the single
     rounding of the single-process kernel.
The backward is the same in reverse: the output gradient rows are dispatched like the input rows (the backward of a
combine is a dispatch), the owner runs mxfp8::moe_backward on its pair-rows (weight gradients accumulate over the
same blocks in the same order as in one process), and each pair's FP32 input-gradient row and affinity gradient
return home, where the input gradient is summed in ascending expert order and rounded once (the backward of a
dispatch is a combine).

Equality with one process: the output, the gradients of hidden_states and of the topk weights (hence of the router
logits), and the expert weight and bias gradients are bitwise equal to a single-process BlockwiseMoE (or
mxfp8.torch.route + mxfp8.torch.moe) on the gathered batch, for any P <= E, any per-rank token counts (a rank may
have none, an expert may get none) and any thread count. With wire="mxfp8" the dispatched rows are MX-quantized along
H by the sending rank (the recipe's MoE element dtype and scale rule, mxfp8.torch.quantize) and dequantized to FP32 by
the owner: the results then equal the single-process layer whose expert inputs are dequantize(quantize(x)) rows and,
in the backward, whose output gradient is dequantize(quantize(dY)) rows, the gradient passing straight through the
round trip (the router and shared experts see the unquantized rows); every row takes the round trip, also the rows a
rank keeps for itself, so that the results do not depend on P. About half the bytes of BF16 rows (1 + 1/32 bytes an
element). (With the "mxfp8" and "nki" recipes the MoE kernels start from that same MX quantization of the rows, and
in the tests the round trip leaves the results unchanged; with "ocp" the weight gradients see it.) wire="bf16" is
the same with the BF16 rounding of the rows as the round trip: for BF16 inputs (a BF16 model, or under autocast) it
is exact and the same as "native"; for FP32 inputs it halves the dispatched bytes.

Bytes on the network (the stats of expert_parallel_moe, BlockwiseMoE.expert_parallel_stats): per step and layer a
rank sends one row of r bytes (H elements of the rows' dtype, or H + ceil(H/32) with the MXFP8 wire) per (token,
other rank owning one of its experts) and a 12-byte record per (token, expert of another rank) in the forward
dispatch, one FP32 row (4 H bytes) per such pair in the combine, the same rows again in the backward dispatch and
4 (H + 1) bytes per pair in the backward combine, plus 16 bytes of counts per other rank: the traffic of
libmxfp8_mpi, so the network model of `mxfp8 bench moe --expert-parallel` (ranks, link bandwidths) prices this
path as well.

Faults and time limits: a local error (bad input, a library error in the local layer) is agreed by all ranks before
the next exchange and raised on every rank as the same ExpertParallelError. A rank that fails outside these calls
(an exception elsewhere in its training step, a crash) leaves the others waiting in a collective until the process
group's timeout (torch.distributed.init_process_group(timeout=...); 30 minutes by default), when torch raises an
error on them: set a timeout that suits the job. Every rank must call the forward and the backward of the layer
(a rank whose loss does not depend on the output must still call backward, e.g. through (0 * y).sum()), with the
same grad mode (agreed: a difference raises before any exchange).

Data parallelism of the dense parameters (router, shared experts, attention, embeddings, ...): every rank holds
them whole and computes their gradients on its own tokens; sum those gradients over the ranks after the backward
with all_reduce_dense_gradients(model) (expert parameters left out), and give each rank the loss
sum(its tokens' losses) / (the global batch's token count). Then every gradient -- dense ones summed, expert ones
(which already receive every rank's tokens) as they are -- is the gradient of the global batch's mean loss. With
torch's DistributedDataParallel instead: leave the expert parameters out
(DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, expert_parameter_names(model))), give
DDP a process group of its own (torch.distributed.new_group) so that its bucketed all-reduces never interleave with
the layer's exchanges, and remember that DDP averages: with per-rank mean losses, divide the expert gradients by P.
The router weight's gradient is a sum of per-rank partial sums: equal in value to one process's, its bits depend
on P, the tokens per rank and the all-reduce's summation order; the router-logit gradients stay bitwise equal.
Gradient-norm clipping must sum the expert gradients' squares over the ranks (each rank holds other experts).
With several expert-parallel groups (expert parallelism inside data-parallel replicas), also all-reduce each
expert gradient over the ranks that hold the same experts in the other groups.
Checkpoints: gather_experts_state_dict(model) gives every rank the single-process state dict (save it on one rank);
split_experts_state_dict(model, state_dict) cuts a single-process state dict down to this rank's experts for
model.load_state_dict (any P: a checkpoint saved on P ranks loads on one and on any other number of ranks).

Not supported: stochastic rounding (an element's random word comes from its position in the gathered problem, which
the local problem does not share); torch.compile (the layer runs eagerly: its shapes depend on the routing);
other devices than the CPU.
"""

import math

import torch
import torch.distributed as dist

from . import _bridge as B
from . import moe_ops as _mo
from .ops import dequantize, quantize
from .recipes import get_recipe

__all__ = ["ExpertParallelError", "WIRES", "expert_range", "expert_parallel_moe", "expert_parameter_names",
           "all_reduce_dense_gradients", "gather_experts_state_dict", "split_experts_state_dict",
           "exchange_bytes"]

WIRES = ("native", "bf16", "mxfp8")
# the expert parameters of BlockwiseMoE, [E, ...] in one process and [E_local, ...] under expert parallelism
EXPERT_PARAMETERS = ("gate_up_proj_weight", "down_proj_weight", "gate_and_up_proj_bias", "down_proj_bias")


class ExpertParallelError(RuntimeError):
    """An error of an expert-parallel layer, raised with the same message on every rank of the group (it names the
    rank or ranks where it arose)."""


def expert_range(num_experts, world_size, rank):
    """(first_expert, num_local_experts) of `rank` among `world_size` ranks holding `num_experts` experts: contiguous
    ranges, as even as possible, the first num_experts % world_size ranks one expert more (mxfp8.mpi.expert_range's
    rule). Needs 1 <= world_size <= num_experts and 0 <= rank < world_size (ValueError otherwise)."""
    for v, n in ((num_experts, "num_experts"), (world_size, "world_size"), (rank, "rank")):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{n}: expected an int, got {type(v).__name__}")
    if not 1 <= world_size <= num_experts:
        raise ValueError(f"expert parallelism: {world_size} ranks for {num_experts} experts (need 1 <= ranks <= "
                         f"experts)")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside [0, {world_size})")
    q, r = divmod(num_experts, world_size)
    return rank * q + min(rank, r), q + (rank < r)


def _owner_table(E, P):
    """(owner rank of each expert [E] int64, first expert of each rank [P] int64)."""
    first = torch.tensor([expert_range(E, P, q)[0] for q in range(P)], dtype=torch.int64)
    owner = torch.zeros(E, dtype=torch.int64)
    for q in range(1, P):
        owner[int(first[q]):] += 1
    return owner, first


def _excl_cumsum(c):
    out = torch.zeros_like(c)
    if c.numel() > 1:
        out[1:] = torch.cumsum(c[:-1], 0)
    return out


# ---------------------------------------------------------------------------------------------------------------
# agreement
# ---------------------------------------------------------------------------------------------------------------
def _describe(e):
    return str(e) if isinstance(e, (ExpertParallelError,)) else f"{type(e).__name__}: {e}"


def _agree(group, error, values=None, what="expert parallel MoE"):
    """One all_gather_object of (error message or None, values dict) over the group; raises the same
    ExpertParallelError on every rank when any rank had an error or when a rank's values differ from rank 0's
    (naming the rank and the field)."""
    P = dist.get_world_size(group)
    msg = None if error is None else _describe(error)
    got = [None] * P
    dist.all_gather_object(got, (msg, values), group=group)
    by_msg = {}
    for q, (m, _) in enumerate(got):
        if m is not None:
            by_msg.setdefault(m, []).append(q)
    bad = [("every rank" if len(qs) == P and P > 1 else "rank " if len(qs) == 1 else "ranks ") +
           ("" if len(qs) == P and P > 1 else ", ".join(map(str, qs))) + f": {m}" for m, qs in by_msg.items()]
    if bad:
        raise ExpertParallelError(f"{what}: " + "; ".join(bad)) from error
    ref = got[0][1]
    if ref is not None:
        for q in range(1, P):
            v = got[q][1]
            for k in ref:
                if v.get(k) != ref[k]:
                    bad.append(f"rank {q} has {k} = {v.get(k)!r}, rank 0 has {ref[k]!r}")
                    break
        if bad:
            raise ExpertParallelError(f"{what}: the ranks disagree: " + "; ".join(bad) +
                                      " (every rank must build the layer with the same configuration and call it "
                                      "with inputs of the same kind)")


def _agree_status(group, error, what):
    """A cheap agreement after local work (one all_reduce of a flag; the messages are gathered only on failure)."""
    flag = torch.tensor([0 if error is None else 1], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    if int(flag[0]):
        _agree(group, error, None, what)


# ---------------------------------------------------------------------------------------------------------------
# rows on the wire
# ---------------------------------------------------------------------------------------------------------------
def _encode(x, wire, recipe):
    """Token rows [T, H] as bytes [T, row_bytes]: their own dtype, or MX codes then E8M0 scales along H."""
    if wire != "mxfp8":
        x = x.to(torch.bfloat16) if wire == "bf16" else x
        return x.contiguous().view(torch.uint8).reshape(x.shape[0], x.shape[1] * x.element_size())
    data, scales = quantize(x, recipe.moe_dtype, axis=-1, scale_rule=recipe.scale_rule)
    return torch.cat([data.view(torch.uint8), scales.view(torch.uint8)], dim=1)


def _decode(rows, idx, wire, dtype, H, recipe):
    """Rows idx of the received bytes as FP32 [len(idx), H] (exact for the native wire; the MX values otherwise)."""
    if wire != "mxfp8":
        return rows.view(torch.bfloat16 if wire == "bf16" else dtype)[idx].float()
    sel = rows[idx]
    codes = sel[:, :H].contiguous().view(recipe.moe_dtype)
    scales = sel[:, H:].contiguous().view(torch.float8_e8m0fnu)
    if sel.shape[0] == 0:
        return torch.empty(0, H, dtype=torch.float32)
    return dequantize(codes, scales, axis=-1, output_dtype=torch.float32)


def _row_bytes(wire, dtype, H):
    if wire == "mxfp8":
        return H + (H + 31) // 32
    return H * (2 if wire == "bf16" else torch.empty(0, dtype=dtype).element_size())


def _exchange(group, send, send_counts, recv_counts, stats=None, key=None):
    """all_to_all_single of rows (dim 0 split by the counts); counts bytes sent to / received from other ranks."""
    recv = send.new_empty((int(sum(recv_counts)),) + tuple(send.shape[1:]))
    dist.all_to_all_single(recv, send.contiguous(), recv_counts, send_counts, group=group)
    if stats is not None:
        me = dist.get_rank(group)
        width = send.element_size() * math.prod(send.shape[1:])
        stats[key + "_bytes_sent"] = stats.get(key + "_bytes_sent", 0) + \
            sum(c for q, c in enumerate(send_counts) if q != me) * width
        stats[key + "_bytes_received"] = stats.get(key + "_bytes_received", 0) + \
            sum(c for q, c in enumerate(recv_counts) if q != me) * width
    return recv


# ---------------------------------------------------------------------------------------------------------------
# the plan of one call
# ---------------------------------------------------------------------------------------------------------------
class _Plan:
    """The routing of one call on this rank: what it sends (home side), what it received and the local problem
    (owner side). Built from the topk ids without communication, then completed by the count exchange."""

    def __init__(self, ids, E, P, rank, B_):
        T, K = ids.shape
        self.T, self.K, self.E, self.P, self.rank, self.B = T, K, E, P, rank, B_
        owner, first = _owner_table(E, P)
        self.e0, self.E_r = expert_range(E, P, rank)
        sids, self.slot = torch.sort(ids.long(), dim=1)          # each token's pairs in ascending expert order
        own = owner[sids]                                        # [T, K], nondecreasing along a row
        newrow = torch.ones_like(own, dtype=torch.bool)          # first pair of each (token, destination)
        if K > 1:
            newrow[:, 1:] = own[:, 1:] != own[:, :-1]
        flat = own.reshape(-1)
        # the send order of the pairs: by destination, then token, then expert (a stable sort of the token-major list)
        self.pair_perm = torch.sort(flat, stable=True).indices
        dest = flat[self.pair_perm]
        nr = newrow.reshape(-1)[self.pair_perm]
        self.spair_cnt = torch.bincount(flat, minlength=P).tolist()
        srow_cnt = torch.bincount(flat[newrow.reshape(-1)], minlength=P)
        self.srow_cnt = srow_cnt.tolist()
        row = torch.cumsum(nr.long(), 0) - 1 - _excl_cumsum(srow_cnt)[dest]   # row index within its destination
        self.srow_tok = (self.pair_perm // max(K, 1))[nr]                      # the token of each sent row
        self.send_lexp = sids.reshape(-1)[self.pair_perm] - first[dest]        # expert index on the destination
        self.send_row = row

    def exchange_counts(self, group, stats):
        send = torch.tensor([[r, p] for r, p in zip(self.srow_cnt, self.spair_cnt)], dtype=torch.int64)
        recv = _exchange(group, send, [1] * self.P, [1] * self.P, stats, "counts")
        self.rrow_cnt, self.rpair_cnt = recv[:, 0].tolist(), recv[:, 1].tolist()

    def local(self, rpairs):
        """The local problem from the received pair records [n, 2] (row within its source, local expert): pair-rows
        ordered (expert, source rank, source token), the block layout, the affinities."""
        P, E_r, B_ = self.P, self.E_r, self.B
        n = rpairs.shape[0]
        src = torch.repeat_interleave(torch.arange(P), torch.tensor(self.rpair_cnt, dtype=torch.int64))
        row = rpairs[:, 0].long()
        lexp = rpairs[:, 1].long()
        rrow = torch.tensor(self.rrow_cnt, dtype=torch.int64)
        if n and (bool((row < 0).any()) or bool((row >= rrow[src]).any()) or bool((lexp < 0).any()) or
                  bool((lexp >= E_r).any())):
            raise ExpertParallelError("internal error: a rank sent a pair naming a row or an expert out of range")
        row_abs = row + _excl_cumsum(rrow)[src]
        self.order = torch.sort(lexp, stable=True).indices      # local pair-row j = received pair order[j]
        self.perm = torch.empty_like(self.order)
        self.perm[self.order] = torch.arange(n)                  # received pair i -> local pair-row perm[i]
        self.lrow = row_abs[self.order]
        self.lexp = lexp[self.order]
        lcnt = torch.bincount(lexp, minlength=E_r)
        nb = (lcnt + B_ - 1) // B_
        self.nloc, self.Nloc = n, int(nb.sum())
        j = torch.arange(n)
        pos = _excl_cumsum(nb)[self.lexp] * B_ + (j - _excl_cumsum(lcnt)[self.lexp])
        tp = torch.full((self.Nloc * B_,), -1, dtype=torch.int32)
        tp[pos] = j.to(torch.int32)
        self.tp = tp
        self.be = torch.repeat_interleave(torch.arange(E_r), nb).to(torch.int32)


# ---------------------------------------------------------------------------------------------------------------
# the differentiable layer
# ---------------------------------------------------------------------------------------------------------------
class _Options:
    __slots__ = ("group", "E", "B", "wire", "recipe", "act", "clamps", "swiglu", "aff", "stats", "x_dtype")


def _local_affinities(plan, weights):
    a = torch.zeros(plan.nloc * plan.E_r, dtype=torch.float32)
    if plan.nloc:
        a[torch.arange(plan.nloc) * plan.E_r + plan.lexp] = weights
    return a.view(-1, 1)


class _ExpertParallelMoE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, w1, w2, b1, b2, ids, opt):
        group, rec = opt.group, opt.recipe
        P, rank = dist.get_world_size(group), dist.get_rank(group)
        T, H = x.shape
        plan = _Plan(ids, opt.E, P, rank, opt.B)
        stats = opt.stats
        plan.exchange_counts(group, stats)
        # dispatch: rows once per (token, destination); pair records (row, local expert, FP32 weight bits)
        local_err = None
        try:
            sbuf = _encode(x, opt.wire, rec)[plan.srow_tok]
        except Exception as e:  # noqa: BLE001 -- agreed below, raised on every rank
            local_err = e
            sbuf = torch.zeros(len(plan.srow_tok), _row_bytes(opt.wire, x.dtype, H), dtype=torch.uint8)
        wsend = w.detach().float().gather(1, plan.slot).reshape(-1)[plan.pair_perm]
        psend = torch.stack([plan.send_row.to(torch.int32), plan.send_lexp.to(torch.int32),
                             wsend.contiguous().view(torch.int32)], dim=1)
        rows = _exchange(group, sbuf, plan.srow_cnt, plan.rrow_cnt, stats, "dispatch")
        rpairs = _exchange(group, psend, plan.spair_cnt, plan.rpair_cnt, stats, "dispatch")
        need_grad = any(ctx.needs_input_grad[:6])
        ck_gu = ck_down = None
        try:
            if local_err is not None:
                raise local_err
            plan.local(rpairs[:, :2])
            la = rpairs[:, 2].contiguous().view(torch.float32)[plan.order]
            a_loc = _local_affinities(plan, la)
            x_loc = _decode(rows, plan.lrow, opt.wire, x.dtype, H, rec)
            y_loc, ck_gu, ck_down = torch.ops.mxfp8.moe(
                x_loc, a_loc, w1, w2, plan.tp, plan.be, plan.B, b1, b2, opt.act, opt.clamps, opt.swiglu, [0, 0],
                opt.aff, rec.moe_dtype, rec.scale_rule, True, need_grad)
            csend = y_loc[plan.perm]
        except Exception as e:  # noqa: BLE001
            local_err = e
        _agree_status(group, local_err, "expert parallel MoE forward")
        crecv = _exchange(group, csend, plan.rpair_cnt, plan.spair_cnt, stats, "combine")
        out = _fold(plan, crecv, H).to(x.dtype)
        if need_grad:
            ctx.save_for_backward(w1, w2, b1, b2, rows, a_loc, ck_gu, ck_down)
            ctx.plan, ctx.opt, ctx.x_dtype, ctx.w_dtype = plan, opt, x.dtype, w.dtype
            ctx.has_bias = (b1 is not None, b2 is not None)
        return out

    @staticmethod
    def backward(ctx, dy):
        w1, w2, b1, b2, rows, a_loc, ck_gu, ck_down = ctx.saved_tensors
        plan, opt = ctx.plan, ctx.opt
        group, rec = opt.group, opt.recipe
        stats = opt.stats
        H = w1.shape[1]
        local_err = None
        try:
            dy = torch.zeros(plan.T, H, dtype=ctx.x_dtype) if dy is None else dy.contiguous()
            sbuf = _encode(dy, opt.wire, rec)[plan.srow_tok]
        except Exception as e:  # noqa: BLE001
            local_err = e
            sbuf = torch.zeros(len(plan.srow_tok), _row_bytes(opt.wire, ctx.x_dtype, H), dtype=torch.uint8)
        drows = _exchange(group, sbuf, plan.srow_cnt, plan.rrow_cnt, stats, "backward_dispatch")
        g = None
        try:
            if local_err is not None:
                raise local_err
            x_loc = _decode(rows, plan.lrow, opt.wire, ctx.x_dtype, H, rec)
            dy_loc = _decode(drows, plan.lrow, opt.wire, dy.dtype, H, rec)
            g = torch.ops.mxfp8.moe_backward(dy_loc, x_loc, a_loc, w1, w2, plan.tp, plan.be, plan.B, b1, b2,
                                             ck_gu, ck_down, opt.act, opt.clamps, opt.swiglu, [0, 0], opt.aff,
                                             rec.moe_dtype, rec.scale_rule, True)
            da = g[1].view(plan.nloc, plan.E_r).gather(1, plan.lexp.view(-1, 1))
            csend = torch.cat([g[0], da], dim=1)[plan.perm]
        except Exception as e:  # noqa: BLE001
            local_err = e
        _agree_status(group, local_err, "expert parallel MoE backward")
        crecv = _exchange(group, csend, plan.rpair_cnt, plan.spair_cnt, stats, "backward_combine")
        R = _unsort(plan, crecv, H + 1)
        dx = _sum_pairs(R[:, :, :H]).to(ctx.x_dtype)
        dw = torch.zeros(plan.T, plan.K, dtype=torch.float32).scatter_(1, plan.slot, R[:, :, H]).to(ctx.w_dtype)
        gb1 = g[4] if ctx.has_bias[0] else None
        gb2 = g[5] if ctx.has_bias[1] else None
        return dx, dw, g[2], g[3], gb1, gb2, None, None


def _unsort(plan, crecv, width):
    """The received pair results back in token-major, ascending-expert order: [T, K, width]."""
    R = torch.empty(plan.T * plan.K, width, dtype=torch.float32)
    R[plan.pair_perm] = crecv
    return R.view(plan.T, plan.K, width)


def _sum_pairs(R):
    """sum over each token's pairs in ascending expert order, from +0, in FP32 (one rounding per addition, as the
    single-process kernel's accumulator)."""
    acc = torch.zeros(R.shape[0], R.shape[2], dtype=torch.float32)
    for k in range(R.shape[1]):
        acc += R[:, k]
    return acc


def _fold(plan, crecv, H):
    return _sum_pairs(_unsort(plan, crecv, H))


# ---------------------------------------------------------------------------------------------------------------
# front end
# ---------------------------------------------------------------------------------------------------------------
def _check_group(group):
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("expert_parallel_group: torch.distributed is not initialized (call "
                         "torch.distributed.init_process_group first, e.g. under torchrun)")
    if group is None:
        raise ValueError("expert_parallel_group: expected a torch.distributed ProcessGroup, got None")
    backend = str(dist.get_backend(group)).lower()
    if backend not in ("gloo", "mpi"):
        raise ValueError(f"expert_parallel_group: backend {backend!r} is not supported (expected 'gloo' or 'mpi': "
                         f"mxfp8 computes on the CPU)")
    return dist.get_world_size(group), dist.get_rank(group)


def _check_wire(wire):
    w = wire.strip().lower() if isinstance(wire, str) else wire
    if w not in WIRES:
        raise ValueError(f"expert_parallel_wire: {wire!r} is not one of {', '.join(map(repr, WIRES))}")
    return w


def _validate(x, ids, w, w1, w2, b1, b2, E, B_, P, rank):
    B.check_tensor(x, "hidden_states", B.FLOAT, ndim=2)
    B.check_ids(ids, "topk_ids")
    B.check_tensor(ids, "topk_ids", B.IDS, ndim=2)
    B.check_tensor(w, "topk_weights", B.FLOAT, ndim=2)
    T, H = x.shape
    if ids.shape[0] != T:
        raise ValueError(f"topk_ids: expected {T} rows (one per token of hidden_states), got {tuple(ids.shape)}")
    if tuple(w.shape) != tuple(ids.shape):
        raise ValueError(f"topk_weights: expected the shape of topk_ids {tuple(ids.shape)}, got {tuple(w.shape)}")
    K = ids.shape[1]
    if not 1 <= K <= E:
        raise ValueError(f"topk_ids: top-k {K} must be in [1, num_experts = {E}]")
    if T:
        if bool((ids < 0).any()) or bool((ids >= E).any()):
            bad = ((ids < 0) | (ids >= E)).nonzero()[0].tolist()
            raise ValueError(f"topk_ids[{bad[0]}, {bad[1]}] = {int(ids[bad[0], bad[1]])} is outside [0, {E})")
        s = torch.sort(ids, dim=1).values
        if K > 1 and bool((s[:, 1:] == s[:, :-1]).any()):
            t = int((s[:, 1:] == s[:, :-1]).any(dim=1).nonzero()[0])
            raise ValueError(f"topk_ids row {t} names an expert twice")
    if isinstance(B_, bool) or not isinstance(B_, int) or B_ < 1:
        raise ValueError(f"block_size: expected an int >= 1, got {B_!r}")
    e0, E_r = expert_range(E, P, rank)
    B.check_tensor(w1, "gate_up_proj_weight", B.FLOAT, ndim=4)
    B.check_tensor(w2, "down_proj_weight", B.FLOAT, ndim=3)
    if w1.shape[0] != E_r or w1.shape[1] != H or w1.shape[2] != 2:
        raise ValueError(f"gate_up_proj_weight: expected [E_local = {E_r}, H = {H}, 2, I] (rank {rank} owns experts "
                         f"{e0}..{e0 + E_r - 1} of {E}), got {tuple(w1.shape)}")
    I = w1.shape[3]
    if tuple(w2.shape) != (E_r, I, H):
        raise ValueError(f"down_proj_weight: expected [E_local, I, H] = {(E_r, I, H)}, got {tuple(w2.shape)}")
    for t, name, shape in ((b1, "gate_and_up_proj_bias", (E_r, 2, I)), (b2, "down_proj_bias", (E_r, H))):
        if t is not None:
            B.check_tensor(t, name, B.FLOAT)
            if tuple(t.shape) != shape:
                raise ValueError(f"{name}: expected shape {shape}, got {tuple(t.shape)}")
    return H, I, K


def expert_parallel_moe(hidden_states, topk_ids, topk_weights, gate_up_proj_weight, down_proj_weight, num_experts,
                        group, *, block_size=128, wire="native", gate_and_up_proj_bias=None, down_proj_bias=None,
                        activation="silu", clamp_limits=None, affinity_option="affinity_on_i", recipe="mxfp8",
                        swiglu_alpha=1.702, swiglu_limit=7.0, stats=None, config=None, local_error=None):
    """The blockwise MXFP8 MoE layer with its experts split over the ranks of `group` (see the module doc);
    collective: every rank of the group calls it, in the same order. Returns output [T_r, H] in hidden_states'
    dtype; differentiable in hidden_states, topk_weights, the weights and the biases (the backward is collective
    too).

    hidden_states [T_r, H]: this rank's tokens (T_r may be 0). topk_ids [T_r, K] (int32 / int64, distinct in a row,
    in [0, num_experts)) and topk_weights [T_r, K] (float32 / bfloat16 / float16): the routing of those tokens, as
    for mxfp8.torch.route. gate_up_proj_weight [E_local, H, 2, I], down_proj_weight [E_local, I, H] and the optional
    biases [E_local, 2, I], [E_local, H]: this rank's experts expert_range(num_experts, P, rank). block_size, the
    activation, clamp_limits, affinity_option, recipe, swiglu_alpha / swiglu_limit: as for mxfp8.torch.moe, the same
    on every rank. wire: "native" (rows in hidden_states' dtype: exact), "bf16" (rows rounded to BF16: exact for BF16
    inputs) or "mxfp8" (MX codes + E8M0 scales along H; see the module doc for what equality then means).
    stats: a dict that receives the bytes sent to and received from the other ranks by each exchange
    ("dispatch_bytes_sent", "combine_bytes_received", ...; the backward adds "backward_dispatch_*" and
    "backward_combine_*"), counted cumulatively. config: a dict of configuration values
    every rank must share (checked with the call's own values in the agreement); local_error: an exception the
    caller met while preparing this call on this rank (it is agreed and raised on every rank).

    Errors: every rank raises the same ExpertParallelError (naming the ranks) for a bad input on any rank, for
    values that differ between ranks, and for a failure of the local layer; nothing is returned on any rank."""
    P, rank = _check_group(group)
    E = num_experts
    err, values = local_error, None
    opt = _Options()
    if err is None:
        try:
            opt.wire = _check_wire(wire)
            opt.recipe = get_recipe(recipe)
            opt.act = _mo._canonical(_mo._mx.ACTIVATIONS, _mo._ACTIVATIONS, _mo._ACT_NAMES, activation,
                                     "activation")
            opt.aff = _mo._canonical(_mo._mx.AFFINITY, _mo._AFFINITY, _mo._AFF_NAMES, affinity_option,
                                     "affinity_option")
            opt.clamps = _mo.clamp_list(clamp_limits)
            opt.swiglu, _ = _mo.numerics_lists(swiglu_alpha, swiglu_limit)
            H, I, K = _validate(hidden_states, topk_ids, topk_weights, gate_up_proj_weight, down_proj_weight,
                                gate_and_up_proj_bias, down_proj_bias, E, block_size, P, rank)
            grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (
                hidden_states, topk_weights, gate_up_proj_weight, down_proj_weight, gate_and_up_proj_bias,
                down_proj_bias))
            # the library's own checks of the local layer (configuration, weights, biases, block size):
            # mxfp8_moe_forward_validate on a routing of no blocks (the rank's blocks exist only after the
            # dispatch); nothing runs, nothing is allocated or written
            cc = B.moe_config(opt.act, opt.clamps, opt.aff, opt.recipe.moe_dtype, opt.recipe.scale_rule, True,
                              gate_and_up_proj_bias is not None or down_proj_bias is not None, opt.swiglu, [0, 0])
            none = torch.zeros(0, dtype=torch.int32)
            B.moe_forward_validate(cc, _mo._inputs(hidden_states.new_empty(0, H), hidden_states.new_zeros(0, 1),
                                                   gate_up_proj_weight, down_proj_weight, none, none, block_size,
                                                   gate_and_up_proj_bias, down_proj_bias))
            values = dict(config or {})
            values.update(world_size=P, num_experts=E, hidden_size=H, intermediate_size=I, top_k=K,
                          block_size=block_size, wire=opt.wire, activation=opt.act, affinity_option=opt.aff,
                          clamp_limits=opt.clamps, swiglu=opt.swiglu,
                          recipe=(str(opt.recipe.moe_dtype), opt.recipe.scale_rule),
                          hidden_states_dtype=str(hidden_states.dtype), topk_weights_dtype=str(topk_weights.dtype),
                          weight_dtypes=(str(gate_up_proj_weight.dtype), str(down_proj_weight.dtype)),
                          bias=(gate_and_up_proj_bias is not None, down_proj_bias is not None), grad_enabled=grad)
        except Exception as e:  # noqa: BLE001 -- agreed, then raised on every rank
            err = e
    _agree(group, err, values)
    opt.group, opt.E, opt.B = group, E, block_size
    opt.stats = {} if stats is None else stats
    return _ExpertParallelMoE.apply(hidden_states, topk_weights, gate_up_proj_weight, down_proj_weight,
                                    gate_and_up_proj_bias, down_proj_bias, topk_ids, opt)


expert_parallel_moe = torch.compiler.disable(expert_parallel_moe)


def exchange_bytes(tokens_per_rank, num_experts, top_k, hidden_size, world_size, wire="native",
                   dtype=torch.bfloat16):
    """The network model: the bytes one rank sends to the others per MoE layer and step, on average over the ranks
    and over uniform top-k routing (each token's top_k experts a uniformly random set of distinct experts), as the
    layer moves them (see the module doc): returns {"forward": bytes, "backward": bytes}. tokens_per_rank T (weak
    scaling: every rank holds T tokens), num_experts E (world_size <= E, contiguous ranges as expert_range),
    top_k K, hidden_size H, world_size P, wire and dtype (of the rows) as for the layer. Per token, with E_q the
    experts of rank q: rows to rank q != home with probability 1 - C(E - E_q, K) / C(E, K), pairs to other ranks
    K (E - E_home) / E; forward = T (rows r + pairs (12 + 4 H)) + 16 (P - 1), backward = T (rows r + pairs 4 (H + 1)),
    r the bytes of a row on the wire. Divide by a link's bandwidth (bytes/s, each direction) for a lower bound of
    the exchange time (no latency, no congestion)."""
    E, K, P, H, T = num_experts, top_k, world_size, hidden_size, tokens_per_rank
    if not 1 <= K <= E:
        raise ValueError(f"top_k: expected 1 <= top_k <= num_experts = {E}, got {K}")
    sizes = [expert_range(E, P, q)[1] for q in range(P)]
    r = _row_bytes(_check_wire(wire), dtype, H)
    none = [math.comb(E - n, K) / math.comb(E, K) for n in sizes]  # P(no expert of a token on rank q)
    rows = sum(sum(1 - none[q] for q in range(P) if q != h) for h in range(P)) / P
    pairs = sum(K * (E - sizes[h]) / E for h in range(P)) / P
    return {"forward": T * (rows * r + pairs * (12 + 4 * H)) + 16 * (P - 1),
            "backward": T * (rows * r + pairs * 4 * (H + 1))}


# ---------------------------------------------------------------------------------------------------------------
# data parallelism of the dense parameters, checkpoints
# ---------------------------------------------------------------------------------------------------------------
def _ep_modules(model):
    """(prefix, module) of every expert-parallel BlockwiseMoE in model (model itself included)."""
    from .modules import BlockwiseMoE
    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, BlockwiseMoE) and getattr(m, "expert_parallel_group", None) is not None]


def expert_parameter_names(model):
    """The fully qualified names of the expert parameters of model's expert-parallel BlockwiseMoE layers (each rank
    holds other experts under these names): the parameters to leave out of data parallelism, e.g.
    torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)."""
    out = []
    for prefix, m in _ep_modules(model):
        for n in EXPERT_PARAMETERS:
            if getattr(m, n, None) is not None:
                out.append(f"{prefix}.{n}" if prefix else n)
    return out


@torch.no_grad()
def all_reduce_dense_gradients(model, group=None, average=False):
    """Data parallelism of everything but the experts: all-reduce (sum) over `group` (None: the default group) the
    gradient of every parameter of model that has one, except the expert parameters of expert-parallel BlockwiseMoE
    layers (expert_parameter_names), in place; average=True divides the sums by the group's size. Collective: every
    rank calls it after its backward, with the same model (the same parameters having gradients: a parameter without
    a gradient on some rank gets zeros there).

    Sum, not mean, is the default: give each rank the loss sum(its tokens' losses) / (the global batch's token count),
    so that the summed dense gradients and the experts' gradients (which receive every rank's tokens) are both the
    gradient of the global batch's mean loss. The router's weight gradient (and every dense gradient) is then a sum
    of P per-rank partial sums: its value is the single-process one, its bits depend on P, the tokens per rank and
    the summation order of the backend's all-reduce (gloo's algorithm for the given P and size); the router-logit
    gradients and everything inside the experts stay bitwise equal to one process."""
    skip = set(expert_parameter_names(model))
    params = [(n, p) for n, p in model.named_parameters() if n not in skip and p.requires_grad]
    P = dist.get_world_size(group)
    by_dtype = {}
    for n, p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        by_dtype.setdefault(p.grad.dtype, []).append(p)
    for dtype, ps in sorted(by_dtype.items(), key=lambda kv: str(kv[0])):
        flat = torch.cat([p.grad.reshape(-1) for p in ps])
        dist.all_reduce(flat, group=group)
        if average:
            flat /= P
        off = 0
        for p in ps:
            k = p.grad.numel()
            p.grad.copy_(flat[off:off + k].view_as(p.grad))
            off += k


@torch.no_grad()
def gather_experts_state_dict(model, keep_vars=False):
    """model.state_dict() with every expert-parallel BlockwiseMoE's expert parameters gathered over its group into
    the full [E, ...] tensors (ranks' ranges in order): the state dict of the same model in one process, loadable
    into it with load_state_dict. Collective over each layer's group (every rank gets the full dict; save it on one
    rank). Other entries are this rank's own (replicated data-parallel parameters are equal on every rank)."""
    sd = model.state_dict(keep_vars=keep_vars)
    for prefix, m in _ep_modules(model):
        g = m.expert_parallel_group
        P = dist.get_world_size(g)
        counts = [expert_range(m.num_experts, P, q)[1] for q in range(P)]
        for n in EXPERT_PARAMETERS:
            t = getattr(m, n, None)
            if t is None:
                continue
            t = t.detach().contiguous()
            pad = torch.zeros((max(counts),) + tuple(t.shape[1:]), dtype=t.dtype)
            pad[:t.shape[0]] = t
            parts = [torch.empty_like(pad).view(torch.uint8) for _ in range(P)]
            dist.all_gather(parts, pad.view(torch.uint8), group=g)   # bytes: any dtype, bit for bit
            full = torch.cat([parts[q].view(t.dtype)[:counts[q]] for q in range(P)])
            sd[f"{prefix}.{n}" if prefix else n] = full
    return sd


def split_experts_state_dict(model, state_dict):
    """The part of a single-process state dict (expert parameters [E, ...]) that this rank's expert-parallel model
    holds: for every expert-parallel BlockwiseMoE of model, its expert entries sliced to its experts
    expert_range(E, P, rank); other entries unchanged. Load the result with model.load_state_dict. Not collective.
    ValueError naming the key when an expert entry is missing or not [E, ...]."""
    out = dict(state_dict)
    for prefix, m in _ep_modules(model):
        e0, n = m.expert_range
        for name in EXPERT_PARAMETERS:
            if getattr(m, name, None) is None:
                continue
            key = f"{prefix}.{name}" if prefix else name
            if key not in state_dict:
                raise ValueError(f"split_experts_state_dict: {key} is missing from the state dict")
            t = state_dict[key]
            own = getattr(m, name)
            if t.dim() != own.dim() or t.shape[0] != m.num_experts or tuple(t.shape[1:]) != tuple(own.shape[1:]):
                raise ValueError(f"split_experts_state_dict: {key} has shape {tuple(t.shape)}, expected "
                                 f"{(m.num_experts,) + tuple(own.shape[1:])} (all {m.num_experts} experts)")
            out[key] = t[e0:e0 + n]
    return out
