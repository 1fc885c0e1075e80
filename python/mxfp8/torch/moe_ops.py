"""MoE custom ops: ``mxfp8::router_linear``, ``mxfp8::topk_softmax``, ``mxfp8::route``, ``mxfp8::moe`` (each with
its backward op) and ``mxfp8::ids_to_int32``.

The layer is the blockwise Mixture-of-Experts of the NKI kernel blockwise_mm_bwd_mxfp8 (the C header mxfp8.h
documents it in its section "Blockwise MoE"): X = hidden_states [T, H], W1 = gate_up_proj_weight [E, H, 2, I],
W2 = down_proj_weight [E, I, H], a = expert_affinities_masked [T*E, 1] (a[t*E + e]), optional biases b1 [E, 2, I]
and b2 [E, H]; tokens sit in N blocks of B = block_size positions, block n belonging to expert block_to_expert[n],
position p holding token token_position_to_id[n*B + p] or padding (-1 with skip_token=True, else T):
    g = clamp(X[t] @ W1[e][:, 0, :] + b1[e, 0]), u = clamp(X[t] @ W1[e][:, 1, :] + b1[e, 1])
    output[t] += a[t*E + e] * (act(g) * u @ W2[e] + b2[e])
The forward (mxfp8_moe_forward) quantizes X and W1 along H, the intermediate and W2 along I; when a backward will
follow (checkpoint=True) it saves the FP32 gate/up projections (held position by position: the
gate_up_proj_act_checkpoint_T [N, 2, I, B] output is a view of [N, B, 2, I] memory, which the library writes and
reads without transposing) and, for affinity_option="affinity_on_h", the down projection, so that the backward
(mxfp8_moe_backward = blockwise_mm_bwd_mxfp8) needs no recomputation; the backward is bitwise equal to calling
mxfp8.blockwise_mm_fwd_mxfp8 / blockwise_mm_bwd_mxfp8 (with or without those checkpoints: the library recomputes
them bit for bit).
"""

import math
from typing import Optional

import torch
from torch import Tensor

from .. import _lib as _mx
from .. import moe_config as _moe_cfg
from .._lib import parse_seed as _parse_seed
from . import _bridge as B
from . import _buffers
from .ops import _bias_grad
from .recipes import get_recipe

__all__ = ["router_linear", "topk_softmax", "route", "moe"]

_lib = torch.library
# the library's names (mxfp8_enum_name), as plain tables (torch.compile traces the argument checks)
_ACTIVATIONS, _ACT_NAMES = dict(_mx.ACTIVATIONS), _mx.ACTIVATIONS.names
_AFFINITY, _AFF_NAMES = dict(_mx.AFFINITY), _mx.AFFINITY.names


def _canonical(table, plain, names, value, param):
    """The canonical name of `value` in the library's enumeration `table` (`plain` / `names`: its plain copies);
    an unknown name raises the library's message for `param`."""
    key = value.strip().lower() if isinstance(value, str) else value
    if key not in plain:
        table.parse(value if isinstance(value, str) else repr(value), param)
    return names[plain[key]]


# ---------------------------------------------------------------------------------------------------------------
# ids
# ---------------------------------------------------------------------------------------------------------------
@_lib.custom_op("mxfp8::ids_to_int32", mutates_args=())
def _ids_to_int32(ids: Tensor, name: str) -> Tensor:
    out = B.ids_to_int32(ids, name)
    return out.clone() if out is ids else out


@_ids_to_int32.register_fake
def _(ids, name):
    return ids.new_empty(ids.shape, dtype=torch.int32)


def _ids32(t, name):
    """int32 ids for the library: int32 as given, int64 converted once by the checked ids_to_int32 op."""
    B.check_ids(t, name)
    return t if t.dtype == torch.int32 else torch.ops.mxfp8.ids_to_int32(t, name)


# ---------------------------------------------------------------------------------------------------------------
# router_linear: the router's logits, each row's bits independent of the batch (one FP32 fmaf chain per element)
# ---------------------------------------------------------------------------------------------------------------
def _rows2(t, width):
    """2-D [rows, width] view of an N-D tensor (leading dims flattened; a copy only where the strides force one)."""
    M = math.prod(t.shape[:-1])
    try:
        return t.view(M, width)
    except RuntimeError:
        return t.reshape(M, width)


@_lib.custom_op("mxfp8::router_linear", mutates_args=())
def _router_linear(input: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    E, H = weight.shape
    out = _buffers.empty((*input.shape[:-1], E), torch.float32)
    B.router_linear_into(_rows2(input, H), weight, bias, out.view(-1, E))
    return out


@_router_linear.register_fake
def _(input, weight, bias):
    return input.new_empty((*input.shape[:-1], weight.shape[0]), dtype=torch.float32)


def _router_grad_shapes(input, weight, bias_dtype, output_mask):
    return ((tuple(input.shape) if output_mask[0] else (0,)), (tuple(weight.shape) if output_mask[1] else (0,)),
            ((weight.shape[0],) if bias_dtype is not None else (0,)))


@_lib.custom_op("mxfp8::router_linear_backward", mutates_args=())
def _router_linear_backward(grad_logits: Tensor, input: Tensor, weight: Tensor, bias_dtype: Optional[torch.dtype],
                            output_mask: list[bool]) -> tuple[Tensor, Tensor, Tensor]:
    E, H = weight.shape
    s_gi, s_gw, _ = _router_grad_shapes(input, weight, bias_dtype, output_mask)
    dl2 = _rows2(grad_logits, E)
    gi = _buffers.empty(s_gi, input.dtype)
    gw = _buffers.empty(s_gw, weight.dtype)
    if output_mask[0]:
        B.router_linear_input_grad_into(dl2, weight, False, gi.view(-1, H))
    if output_mask[1]:
        B.router_linear_weight_grad_into(dl2, _rows2(input, H), False, gw)
    gb = torch.empty(0) if bias_dtype is None else _bias_grad(dl2, bias_dtype)
    return gi, gw, gb


@_router_linear_backward.register_fake
def _(grad_logits, input, weight, bias_dtype, output_mask):
    s_gi, s_gw, s_gb = _router_grad_shapes(input, weight, bias_dtype, output_mask)
    return (input.new_empty(s_gi), weight.new_empty(s_gw),
            weight.new_empty(s_gb, dtype=torch.float32 if bias_dtype is None else bias_dtype))


def _router_linear_setup(ctx, inputs, output):
    input, weight, bias = inputs
    ctx.save_for_backward(input, weight)
    ctx.bias_dtype = None if bias is None else bias.dtype


def _router_linear_grad(ctx, grad_logits):
    input, weight = ctx.saved_tensors
    need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    need_b = ctx.bias_dtype is not None and ctx.needs_input_grad[2]
    gi, gw, gb = torch.ops.mxfp8.router_linear_backward(grad_logits, input, weight,
                                                         ctx.bias_dtype if need_b else None, [need_x, need_w])
    return (gi if need_x else None), (gw if need_w else None), (gb if need_b else None)


_router_linear.register_autograd(_router_linear_grad, setup_context=_router_linear_setup)


def router_linear(input, weight, bias=None):
    """Router logits input @ weight^T + bias in float32, each element one FP32 fused multiply-add chain over the
    hidden size in ascending order from +0, then + bias once (the library's mxfp8_router_linear; no quantization).
    Unlike nn.Linear (a BLAS GEMM whose summation order depends on how many rows it is given and on the thread
    count), a row's logits are bitwise the same whatever other rows share the batch, whatever the thread count:
    use it where routing must not depend on the batch split (expert parallelism, batch-invariant inference).

    input [..., H] (float32 / bfloat16 / float16, any strides), weight [E, H] (nn.Linear(H, E).weight), bias [E]
    or None. Returns float32 logits [..., E]. Differentiable in input, weight and bias: grad_input[t, h] = fmaf chain
    over the experts of grad_logits[t, e] * weight[e, h] (so batch-invariant too), rounded once to input's dtype;
    grad_weight[e, h] = fmaf chain over the rows in order, rounded once to weight's dtype; grad_bias = the sum of
    grad_logits over the rows in FP32 in one fixed order (mxfp8_bias_grad). Under CPU autocast it still runs in
    FP32 on the given dtypes (it is not autocast to a bfloat16 GEMM). Errors: TypeError / ValueError naming the
    parameter; MXFP8Error from the library."""
    B.check_tensor(input, "input", B.FLOAT)
    B.check_tensor(weight, "weight", B.FLOAT, ndim=2)
    if input.dim() < 1 or input.shape[-1] != weight.shape[1]:
        raise ValueError(f"input: last dimension must be the hidden size H = {weight.shape[1]} (weight is [E, H] = "
                         f"{tuple(weight.shape)}), got shape {tuple(input.shape)}")
    if bias is not None:
        B.check_tensor(bias, "bias", B.FLOAT, ndim=1)
        if bias.shape[0] != weight.shape[0]:
            raise ValueError(f"bias: expected shape ({weight.shape[0]},) (the number of experts), got "
                             f"{tuple(bias.shape)}")
    return torch.ops.mxfp8.router_linear(input, weight, bias)


# ---------------------------------------------------------------------------------------------------------------
# topk_softmax: the router's softmax -> top-k -> renormalize, one op so that compiled graphs keep eager's bits
# ---------------------------------------------------------------------------------------------------------------
def _topk_softmax_fwd(router_logits, top_k, renormalize):
    probs = torch.softmax(router_logits.to(torch.float32), dim=-1)
    # a stable descending sort keeps equal probabilities in expert order: ties go to the lower expert id
    ids = torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :top_k].contiguous()
    w = probs.gather(1, ids)
    if renormalize:
        w = w / w.sum(dim=-1, keepdim=True)
    return probs, w, ids


@_lib.custom_op("mxfp8::topk_softmax", mutates_args=())
def _topk_softmax(router_logits: Tensor, top_k: int, renormalize: bool) -> tuple[Tensor, Tensor]:
    _, w, ids = _topk_softmax_fwd(router_logits, top_k, renormalize)
    return w, ids


@_topk_softmax.register_fake
def _(router_logits, top_k, renormalize):
    T = router_logits.shape[0]
    return (router_logits.new_empty((T, top_k), dtype=torch.float32),
            router_logits.new_empty((T, top_k), dtype=torch.int64))


@_lib.custom_op("mxfp8::topk_softmax_backward", mutates_args=())
def _topk_softmax_backward(grad_weights: Tensor, router_logits: Tensor, topk_ids: Tensor,
                           renormalize: bool) -> Tensor:
    probs = torch.softmax(router_logits.to(torch.float32), dim=-1)
    g = grad_weights.to(torch.float32)
    if renormalize:  # w = r / sum(r), r = probs[ids]:  dr = (dw - sum(dw * w)) / sum(r)
        r = probs.gather(1, topk_ids)
        s = r.sum(dim=-1, keepdim=True)
        g = (g - (g * (r / s)).sum(dim=-1, keepdim=True)) / s
    dp = torch.zeros_like(probs).scatter_(1, topk_ids, g)
    dl = probs * (dp - (dp * probs).sum(dim=-1, keepdim=True))  # softmax: dl = p * (dp - <dp, p>)
    return dl.to(router_logits.dtype)


@_topk_softmax_backward.register_fake
def _(grad_weights, router_logits, topk_ids, renormalize):
    return router_logits.new_empty(router_logits.shape)


def _topk_softmax_setup(ctx, inputs, output):
    router_logits, top_k, renormalize = inputs
    ctx.save_for_backward(router_logits, output[1])
    ctx.renormalize = renormalize


def _topk_softmax_grad(ctx, grad_weights, grad_ids):
    router_logits, ids = ctx.saved_tensors
    return torch.ops.mxfp8.topk_softmax_backward(grad_weights, router_logits, ids, ctx.renormalize), None, None


_topk_softmax.register_autograd(_topk_softmax_grad, setup_context=_topk_softmax_setup)


def topk_softmax(router_logits, top_k, renormalize=True):
    """Router of a top-k MoE: probabilities = softmax(router_logits) over the E experts in FP32, the top_k largest
    (ties to the lower expert id), divided by their sum when renormalize (as Mixtral). router_logits [T, E]
    (float32 / bfloat16 / float16). Returns (topk_weights [T, top_k] float32, topk_ids [T, top_k] int64);
    differentiable in router_logits (through the weights)."""
    B.check_tensor(router_logits, "router_logits", B.FLOAT, ndim=2)
    E = router_logits.shape[1]
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= E:
        raise ValueError(f"top_k: expected an int in [1, {E}] (the number of experts), got {top_k!r}")
    return torch.ops.mxfp8.topk_softmax(router_logits, top_k, bool(renormalize))


# ---------------------------------------------------------------------------------------------------------------
# route (the op returns the float output first: (expert_affinities_masked, token_position_to_id, block_to_expert);
# route() returns them in the numpy package's order)
# ---------------------------------------------------------------------------------------------------------------
def _route_shapes(topk_ids, num_experts, block_size):
    T, K = topk_ids.shape
    N = B.num_blocks(T, K, num_experts, block_size)
    return (N * block_size,), (N, 1), (T * num_experts, 1)


@_lib.custom_op("mxfp8::route", mutates_args=())
def _route(topk_ids: Tensor, topk_weights: Tensor, num_experts: int, block_size: int,
           skip_token: bool) -> tuple[Tensor, Tensor, Tensor]:
    s_tp, s_be, s_a = _route_shapes(topk_ids, num_experts, block_size)
    tp = torch.empty(s_tp, dtype=torch.int32)
    be = torch.empty(s_be, dtype=torch.int32)
    a = torch.empty(s_a, dtype=topk_weights.dtype)
    B.route_into(B.ids_to_int32(topk_ids, "topk_ids"), topk_weights, num_experts, block_size, skip_token, tp, be, a)
    return a, tp, be


@_route.register_fake
def _(topk_ids, topk_weights, num_experts, block_size, skip_token):
    s_tp, s_be, s_a = _route_shapes(topk_ids, num_experts, block_size)
    return (topk_weights.new_empty(s_a), topk_ids.new_empty(s_tp, dtype=torch.int32),
            topk_ids.new_empty(s_be, dtype=torch.int32))


def _route_setup(ctx, inputs, output):
    topk_ids, topk_weights, num_experts = inputs[0], inputs[1], inputs[2]
    ctx.save_for_backward(topk_ids)
    ctx.num_experts = num_experts


def _route_grad(ctx, g_a, g_tp, g_be):
    (topk_ids,) = ctx.saved_tensors
    T = topk_ids.shape[0]
    # a[t*E + ids[t, k]] = weights[t, k]: the gradient of a weight is the gradient of the entry it was copied to
    gw = g_a.reshape(T, ctx.num_experts).gather(1, topk_ids.long())
    return None, gw, None, None, None


_route.register_autograd(_route_grad, setup_context=_route_setup)


def route(topk_ids, topk_weights, num_experts, block_size, *, skip_token=True):
    """Block layout of a top-k routing (mxfp8_moe_route, the convention of the NKI kernel's tests): returns
    (token_position_to_id [N*B] int32, block_to_expert [N, 1] int32, expert_affinities_masked [T*E, 1] of
    topk_weights' dtype) with N = ceil((T*K - (E-1)) / B) + E - 1. Expert e gets ceil(count_e / B) blocks in
    expert order holding its tokens in ascending order, the last one padded (-1 with skip_token, else T); leftover
    blocks are all padding and belong to expert E-1. a[t*E + e] = the weight of e in row t, 0 where row t does not
    choose e; differentiable in topk_weights (the gradient of a weight is that of its entry of a).
    topk_ids [T, K]: int32 / int64, distinct in a row, in [0, E). topk_weights [T, K]: float32 / bfloat16 /
    float16. num_experts E >= top_k; block_size B >= 1 (positions per block). Errors: duplicate or out-of-range ids
    raise MXFP8Error; wrong dtypes / shapes TypeError / ValueError."""
    B.check_ids(topk_ids, "topk_ids")
    B.check_tensor(topk_ids, "topk_ids", B.IDS, ndim=2)
    B.check_tensor(topk_weights, "topk_weights", B.FLOAT, ndim=2)
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError(f"topk_weights: expected the shape of topk_ids {tuple(topk_ids.shape)}, got "
                         f"{tuple(topk_weights.shape)}")
    a, tp, be = torch.ops.mxfp8.route(topk_ids, topk_weights, int(num_experts), int(block_size), bool(skip_token))
    return tp, be, a


# ---------------------------------------------------------------------------------------------------------------
# moe
# ---------------------------------------------------------------------------------------------------------------
def _ckpt_shapes(hidden_states, gate_up_proj_weight, token_position_to_id, block_size, affinity_option, checkpoint):
    """Shapes of the checkpoints the forward saves for the backward ((0,): none saved)."""
    T, H = hidden_states.shape
    I = gate_up_proj_weight.shape[3]
    N = token_position_to_id.numel() // block_size if block_size >= 1 else 0  # else the library refuses the call
    down = (N, block_size, H) if affinity_option == "affinity_on_h" and checkpoint else (0,)
    return ((N, 2, I, block_size) if checkpoint else (0,)), down


def _gate_up_ckpt(alloc, shape):
    """The gate/up checkpoint of `shape` ([N, 2, I, B], or (0,) for none) as FP32: a [N, 2, I, B] view of
    positions-major memory [N, B, 2, I] (strides (2IB, I, 1, 2I)), so that each position's 2I values are contiguous
    where the library writes them (forward) and reads them (backward); the same values as a contiguous one."""
    if len(shape) != 4:
        return alloc(shape, torch.float32)
    N, two, I, B = shape
    return alloc((N, B, two, I), torch.float32).permute(0, 2, 3, 1)


def _inputs(hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight, token_position_to_id,
            block_to_expert, block_size, gate_and_up_proj_bias, down_proj_bias):
    return dict(hidden_states=hidden_states, expert_affinities_masked=expert_affinities_masked,
                gate_up_proj_weight=gate_up_proj_weight, down_proj_weight=down_proj_weight,
                token_position_to_id=token_position_to_id, block_to_expert=block_to_expert, block_size=block_size,
                gate_and_up_proj_bias=gate_and_up_proj_bias, down_proj_bias=down_proj_bias)


@_lib.custom_op("mxfp8::moe", mutates_args=())
def _moe(hidden_states: Tensor, expert_affinities_masked: Tensor, gate_up_proj_weight: Tensor,
         down_proj_weight: Tensor, token_position_to_id: Tensor, block_to_expert: Tensor, block_size: int,
         gate_and_up_proj_bias: Optional[Tensor], down_proj_bias: Optional[Tensor], activation: str,
         clamp_limits: list[float], swiglu: list[float], rounding: list[int], affinity_option: str,
         elem_dtype: torch.dtype, scale_rule: str, skip_token: bool,
         checkpoint: bool) -> tuple[Tensor, Tensor, Tensor]:
    s_gu, s_down = _ckpt_shapes(hidden_states, gate_up_proj_weight, token_position_to_id, block_size,
                                affinity_option, checkpoint)
    output = _buffers.empty(hidden_states.shape, hidden_states.dtype)
    gate_up = _gate_up_ckpt(_buffers.empty, s_gu)
    down = _buffers.empty(s_down, torch.float32)
    bias = gate_and_up_proj_bias is not None or down_proj_bias is not None
    cc = B.moe_config(activation, clamp_limits, affinity_option, elem_dtype, scale_rule, skip_token, bias, swiglu,
                      rounding)
    inputs = _inputs(hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
                     token_position_to_id, block_to_expert, block_size, gate_and_up_proj_bias, down_proj_bias)
    B.moe_forward_into(cc, inputs, output, gate_up if gate_up.dim() == 4 else None,
                       down if down.dim() == 3 else None)
    return output, gate_up, down


@_moe.register_fake
def _(hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight, token_position_to_id,
      block_to_expert, block_size, gate_and_up_proj_bias, down_proj_bias, activation, clamp_limits, swiglu, rounding,
      affinity_option, elem_dtype, scale_rule, skip_token, checkpoint):
    s_gu, s_down = _ckpt_shapes(hidden_states, gate_up_proj_weight, token_position_to_id, block_size,
                                affinity_option, checkpoint)
    return (hidden_states.new_empty(hidden_states.shape),
            _gate_up_ckpt(lambda shape, dtype: hidden_states.new_empty(shape, dtype=dtype), s_gu),
            hidden_states.new_empty(s_down, dtype=torch.float32))


_GRADS = ("hidden_states_grad", "expert_affinities_masked_grad", "gate_up_proj_weight_grad",
          "down_proj_weight_grad", "gate_and_up_proj_bias_grad", "down_proj_bias_grad")


@_lib.custom_op("mxfp8::moe_backward", mutates_args=())
def _moe_backward(grad_output: Tensor, hidden_states: Tensor, expert_affinities_masked: Tensor,
                  gate_up_proj_weight: Tensor, down_proj_weight: Tensor, token_position_to_id: Tensor,
                  block_to_expert: Tensor, block_size: int, gate_and_up_proj_bias: Optional[Tensor],
                  down_proj_bias: Optional[Tensor], gate_up_proj_act_checkpoint_T: Tensor,
                  down_proj_output_checkpoint: Tensor, activation: str, clamp_limits: list[float],
                  swiglu: list[float], rounding: list[int], affinity_option: str, elem_dtype: torch.dtype,
                  scale_rule: str, skip_token: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    bias = gate_and_up_proj_bias is not None or down_proj_bias is not None
    grads = _grad_buffers(hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
                          gate_and_up_proj_bias, down_proj_bias, _buffers.empty)
    cc = B.moe_config(activation, clamp_limits, affinity_option, elem_dtype, scale_rule, skip_token, bias, swiglu,
                      rounding)
    inputs = _inputs(hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
                     token_position_to_id, block_to_expert, block_size, gate_and_up_proj_bias, down_proj_bias)
    c_grads = {k: v for k, v in zip(_GRADS, grads) if k in _GRADS[:4] or bias}
    # absent checkpoints ([0]) are recomputed by the library, bitwise equal to the forward's
    gate_up = gate_up_proj_act_checkpoint_T if gate_up_proj_act_checkpoint_T.dim() == 4 else None
    down = down_proj_output_checkpoint if down_proj_output_checkpoint.dim() == 3 else None
    B.moe_backward_into(cc, inputs, grad_output, gate_up, down, c_grads)
    return grads


def _grad_buffers(hidden_states, a, w1, w2, b1, b2, alloc):
    """Gradient tensors in the dtypes of their inputs; a layer without bias gets empty [0] bias gradients."""
    def like(t, ref):
        return alloc(tuple(t.shape), dtype=t.dtype) if ref is not None else alloc((0,), dtype=torch.float32)
    bias = b1 is not None or b2 is not None
    E, H, _, I = w1.shape
    gb1 = alloc((E, 2, I), dtype=(b1.dtype if b1 is not None else w1.dtype)) if bias else like(w1, None)
    gb2 = alloc((E, H), dtype=(b2.dtype if b2 is not None else w2.dtype)) if bias else like(w2, None)
    return (like(hidden_states, hidden_states), like(a, a), like(w1, w1), like(w2, w2), gb1, gb2)


@_moe_backward.register_fake
def _(grad_output, hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
      token_position_to_id, block_to_expert, block_size, gate_and_up_proj_bias, down_proj_bias,
      gate_up_proj_act_checkpoint_T, down_proj_output_checkpoint, activation, clamp_limits, swiglu, rounding,
      affinity_option, elem_dtype, scale_rule, skip_token):
    return _grad_buffers(hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
                         gate_and_up_proj_bias, down_proj_bias,
                         lambda shape, dtype: hidden_states.new_empty(shape, dtype=dtype))


def _moe_setup(ctx, inputs, output):
    (x, a, w1, w2, tp, be, bs, b1, b2, act, clamps, swiglu, rounding, aff, elem, rule, skip, _) = inputs
    ctx.save_for_backward(x, a, w1, w2, tp, be, b1, b2, output[1], output[2])
    ctx.options = (bs, act, clamps, swiglu, rounding, aff, elem, rule, skip)
    ctx.has_bias = (b1 is not None, b2 is not None)
    ctx.set_materialize_grads(False)


def _moe_grad(ctx, grad_output, g_ck1, g_ck2):
    x, a, w1, w2, tp, be, b1, b2, ck_gu, ck_down = ctx.saved_tensors
    bs, act, clamps, swiglu, rounding, aff, elem, rule, skip = ctx.options
    if grad_output is None:
        grad_output = torch.zeros_like(x)
    g = torch.ops.mxfp8.moe_backward(grad_output, x, a, w1, w2, tp, be, bs, b1, b2, ck_gu, ck_down, act, clamps,
                                     swiglu, rounding, aff, elem, rule, skip)
    gb1 = g[4] if ctx.has_bias[0] else None
    gb2 = g[5] if ctx.has_bias[1] else None
    return (g[0], g[1], g[2], g[3], None, None, None, gb1, gb2) + (None,) * 9


_moe.register_autograd(_moe_grad, setup_context=_moe_setup)


def clamp_list(clamp_limits):
    """[gate lower, gate upper, up lower, up upper] (+-inf = no limit) of a ClampLimits, a dict of its field names,
    or None. non_linear_* limits clamp the gate projection g, linear_* limits the up projection u."""
    if clamp_limits is None:
        return [-math.inf, math.inf, -math.inf, math.inf]
    if not isinstance(clamp_limits, (dict, _moe_cfg.ClampLimits)):  # a tuple would otherwise clamp nothing
        raise TypeError(f"clamp_limits: expected an mxfp8.ClampLimits, a dict of its fields or None, got "
                        f"{type(clamp_limits).__name__} {clamp_limits!r}")
    get = clamp_limits.get if isinstance(clamp_limits, dict) else (lambda k: getattr(clamp_limits, k, None))
    if isinstance(clamp_limits, dict):
        unknown = set(clamp_limits) - {"non_linear_clamp_lower_limit", "non_linear_clamp_upper_limit",
                                       "linear_clamp_lower_limit", "linear_clamp_upper_limit"}
        if unknown:
            raise ValueError(f"clamp_limits: unknown field(s) {sorted(unknown)}")
    out = []
    for field, default in (("non_linear_clamp_lower_limit", -math.inf), ("non_linear_clamp_upper_limit", math.inf),
                           ("linear_clamp_lower_limit", -math.inf), ("linear_clamp_upper_limit", math.inf)):
        v = get(field)
        v = default if v is None else float(v)
        if math.isnan(v):
            raise ValueError(f"clamp_limits.{field} is NaN")
        out.append(v)
    if out[0] > out[1] or out[2] > out[3]:
        raise ValueError(f"clamp_limits: a lower limit exceeds its upper limit ({out})")
    return out


def numerics_lists(swiglu_alpha=1.702, swiglu_limit=7.0, stochastic_rounding=None, rounding_seed=0):
    """The ops' swiglu [alpha, limit] and rounding [operand bitmask, seed as a signed 64-bit int] arguments, checked:
    stochastic_rounding is None, operand names of mxfp8.MOE_OPERANDS, "gradients", "all" or a bitmask (as
    mxfp8.MXFP8MOEBwdConfig.stochastic_rounding); rounding_seed an int in [0, 2**64); swiglu_limit > 0, both
    finite-or-inf numbers (the library checks them again)."""
    alpha, limit = float(swiglu_alpha), float(swiglu_limit)
    if not math.isfinite(alpha) or math.isnan(limit) or limit <= 0:
        raise ValueError(f"swiglu_alpha / swiglu_limit: need a finite alpha and a limit > 0, got {alpha}, {limit}")
    mask = _moe_cfg.MXFP8MOEBwdConfig(stochastic_rounding=() if stochastic_rounding is None
                                      else stochastic_rounding)._rounding_mask()
    seed = _parse_seed(rounding_seed, "rounding_seed")
    return [alpha, limit], [mask, seed - (1 << 64) if seed >= 1 << 63 else seed]


def _check_moe(x, a, w1, w2, b1, b2):
    """What only torch can say about the tensors (type, device, layout, dtype, rank), naming the parameter; the
    layer's own rules (shapes against each other, block_size, routing ids) are the library's
    (mxfp8_moe_forward_validate, in moe())."""
    B.check_tensor(x, "hidden_states", B.FLOAT, ndim=2)
    B.check_tensor(a, "expert_affinities_masked", B.FLOAT, ndim=(1, 2))
    B.check_tensor(w1, "gate_up_proj_weight", B.FLOAT, ndim=4)
    B.check_tensor(w2, "down_proj_weight", B.FLOAT, ndim=3)
    for t, name in ((b1, "gate_and_up_proj_bias"), (b2, "down_proj_bias")):
        if t is not None:
            B.check_tensor(t, name, B.FLOAT)


def _concrete(*tensors):
    """True outside tracing: every tensor a plain tensor or parameter with data (not a FakeTensor of
    torch.compile / make_fx), so that the library can check it."""
    if torch.compiler.is_compiling():
        return False
    return all(type(t) in (torch.Tensor, torch.nn.Parameter) for t in tensors if t is not None)


def moe(hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight, token_position_to_id,
        block_to_expert, block_size, *, gate_and_up_proj_bias=None, down_proj_bias=None, activation="silu",
        clamp_limits=None, affinity_option="affinity_on_i", recipe="mxfp8", skip_token=True, swiglu_alpha=1.702,
        swiglu_limit=7.0, stochastic_rounding=None, rounding_seed=0):
    """The MXFP8 blockwise MoE layer (forward mxfp8_moe_forward, backward the NKI kernel blockwise_mm_bwd_mxfp8),
    see the module doc. Returns output [T, H] in hidden_states' dtype; differentiable in hidden_states,
    expert_affinities_masked, both weights and both biases (gradients in the dtype of each).

    hidden_states [T, H], expert_affinities_masked [T*E, 1] (or [T*E]), gate_up_proj_weight [E, H, 2, I],
    down_proj_weight [E, I, H], gate_and_up_proj_bias [E, 2, I] and down_proj_bias [E, H] (optional; one given
    alone means the other is zero): float32 / bfloat16 / float16 CPU tensors.
    token_position_to_id [N*B], block_to_expert [N] or [N, 1]: int32 or int64 (int64 is converted once, checked);
    block_size B >= 1 (an int).
    activation: "silu" | "swish" | "squared_relu" | "gpt_oss_swiglu" (gpt-oss: (u + 1) g sigmoid(alpha g), g
    clamped above at swiglu_limit, u to [-limit, limit]; swiglu_alpha 1.702 and swiglu_limit 7 by default).
    clamp_limits: mxfp8.ClampLimits (or a dict of its fields) or None. affinity_option: "affinity_on_i" |
    "affinity_on_h". recipe: its moe_dtype and scale_rule are used. stochastic_rounding: GEMM operands whose
    elements are rounded stochastically (names of mxfp8.MOE_OPERANDS, "gradients", "all"; None: none), keyed by
    rounding_seed (an int in [0, 2**64); use a new one per step) -- reproducible bit for bit.
    skip_token: padding positions hold -1 (True) or T (False). Errors: TypeError / ValueError naming the
    parameter for what is torch's (types, devices, dtypes, ranks, names); MXFP8Error with the library's message for
    the layer's rules (shapes that disagree, block_size, ids out of range, ...), checked before anything runs;
    nothing is written."""
    r = get_recipe(recipe)
    _check_moe(hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
               gate_and_up_proj_bias, down_proj_bias)
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError(f"block_size: expected an int, got {block_size!r}")
    # canonical names (the custom ops take strings); unknown names: the library's message
    act = _canonical(_mx.ACTIVATIONS, _ACTIVATIONS, _ACT_NAMES, activation, "activation")
    aff = _canonical(_mx.AFFINITY, _AFFINITY, _AFF_NAMES, affinity_option, "affinity_option")
    tp = _ids32(token_position_to_id, "token_position_to_id")
    be = _ids32(block_to_expert, "block_to_expert")
    # checkpoints for the backward only when there will be one (no_grad / inference: none are written)
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (
        hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight, gate_and_up_proj_bias,
        down_proj_bias))
    swiglu, rounding = numerics_lists(swiglu_alpha, swiglu_limit, stochastic_rounding, rounding_seed)
    inputs = (hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight, tp, be,
              gate_and_up_proj_bias, down_proj_bias)
    if _concrete(*inputs):  # the library's checks of the whole call, before the op allocates or records anything
        bias = gate_and_up_proj_bias is not None or down_proj_bias is not None
        cc = B.moe_config(act, clamp_list(clamp_limits), aff, r.moe_dtype, r.scale_rule, bool(skip_token), bias,
                          swiglu, rounding)
        B.moe_forward_validate(cc, _inputs(hidden_states, expert_affinities_masked, gate_up_proj_weight,
                                           down_proj_weight, tp, be, block_size, gate_and_up_proj_bias,
                                           down_proj_bias))
    out, _, _ = torch.ops.mxfp8.moe(hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
                                    tp, be, block_size, gate_and_up_proj_bias, down_proj_bias, act,
                                    clamp_list(clamp_limits), swiglu, rounding, aff, r.moe_dtype, r.scale_rule,
                                    bool(skip_token), grad)
    return out
