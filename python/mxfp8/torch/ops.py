"""The mxfp8 custom ops (torch.library, namespace ``mxfp8``) and their Python front ends.

Each op has a real (CPU) implementation that hands the tensors to libmxfp8 as zero-copy views, a fake (meta)
implementation for torch.compile / FakeTensor tracing, and, where differentiable, an autograd formula registered
with torch.library.register_autograd whose backward is itself an op (so AOTAutograd traces it):

    torch.ops.mxfp8.quantize(x, axis, elem_dtype, scale_rule, group) -> (data, scales)
    torch.ops.mxfp8.dequantize(data, scales, axis, group, output_dtype) -> out
    torch.ops.mxfp8.linear(input, weight, bias?, elem_dtype, scale_rule) -> output        (differentiable)
    torch.ops.mxfp8.linear_backward(grad_output, input, weight, elem_dtype, scale_rule, bias_dtype?)
        -> (grad_input, grad_weight, grad_bias)                     (grad_bias empty when bias_dtype is None)
    torch.ops.mxfp8.router_linear(input, weight, bias?) -> float32 logits       (differentiable; batch-invariant)
    torch.ops.mxfp8.router_linear_backward(grad_logits, input, weight, bias_dtype?, output_mask)
        -> (grad_input, grad_weight, grad_bias)          (each empty when not asked for: output_mask, bias_dtype)
    torch.ops.mxfp8.topk_softmax(router_logits, top_k, renormalize) -> (topk_weights, topk_ids)  (differentiable)
    torch.ops.mxfp8.topk_softmax_backward(grad_weights, router_logits, topk_ids, renormalize) -> grad_logits
    torch.ops.mxfp8.route(topk_ids, topk_weights, num_experts, block_size, skip_token)
        -> (expert_affinities_masked, token_position_to_id, block_to_expert)            (differentiable in weights)
    torch.ops.mxfp8.moe(hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
                        token_position_to_id, block_to_expert, block_size, gate_and_up_proj_bias?, down_proj_bias?,
                        activation, clamp_limits, swiglu, rounding, affinity_option, elem_dtype, scale_rule,
                        skip_token, checkpoint)
        -> (output, gate_up_proj_act_checkpoint_T, down_proj_output_checkpoint)           (differentiable)
        (swiglu = [alpha, limit] of gpt_oss_swiglu; rounding = [stochastic-rounding operand bitmask, seed as a
        signed 64-bit int])
    torch.ops.mxfp8.moe_backward(...) -> the six gradients of blockwise_mm_bwd_mxfp8
    torch.ops.mxfp8.ids_to_int32(ids, name) -> int32 ids (range-checked)
plus out= variants quantize_out, dequantize_out, linear_out, linear_backward_out that write into given tensors.
This module defines the quantize and linear ops; moe_ops.py the router, route and moe ops. The Python functions
(quantize, dequantize, linear, linear_backward here; topk_softmax, route, moe there) are the documented way in:
they check devices, dtypes and ranks with errors naming the parameter, map recipes to element dtypes and convert
int64 ids once.
"""

import ctypes
import math
from typing import Optional

import torch
from torch import Tensor

from . import _bridge as B
from . import _buffers
from .recipes import get_recipe

__all__ = ["quantize", "dequantize", "linear", "linear_backward"]

_lib = torch.library


def _norm_axis(axis, ndim, name="axis"):
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"{name}: expected an int, got {type(axis).__name__}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name}: {axis} is out of range for a {ndim}-D tensor")
    return axis % ndim


def _scales_shape(shape, axis):
    s = list(shape)
    s[axis] = -(-s[axis] // 32)
    return s


# ---------------------------------------------------------------------------------------------------------------
# quantize / dequantize
# ---------------------------------------------------------------------------------------------------------------
@_lib.custom_op("mxfp8::quantize", mutates_args=())
def _quantize(x: Tensor, axis: int, elem_dtype: torch.dtype, scale_rule: str, group: str) -> tuple[Tensor, Tensor]:
    data = torch.empty(x.shape, dtype=elem_dtype)
    scales = torch.empty(_scales_shape(x.shape, axis), dtype=torch.float8_e8m0fnu)
    B.quantize_into(x, axis, elem_dtype, scale_rule, group, data, scales)
    return data, scales


@_quantize.register_fake
def _(x, axis, elem_dtype, scale_rule, group):
    return x.new_empty(x.shape, dtype=elem_dtype), x.new_empty(_scales_shape(x.shape, axis),
                                                               dtype=torch.float8_e8m0fnu)


@_lib.custom_op("mxfp8::quantize_out", mutates_args=("data", "scales"))
def _quantize_out(x: Tensor, axis: int, elem_dtype: torch.dtype, scale_rule: str, group: str, data: Tensor,
                  scales: Tensor) -> None:
    B.quantize_into(x, axis, elem_dtype, scale_rule, group, data, scales)


@_quantize_out.register_fake
def _(x, axis, elem_dtype, scale_rule, group, data, scales):
    return None


def quantize(x, elem_dtype=torch.float8_e4m3fn, axis=-1, scale_rule="nki", group="1x32", *, out=None):
    """MX-quantize `x` along `axis` (OCP MX v1.0 section 6.3; NKI quantize_mx): groups of 32 consecutive values
    (group="1x32"; "wrapx" = Trainium's grouping, axis length % 128 == 0) share one E8M0 scale 2^e, elements are
    RNE(x * 2^-e) in `elem_dtype`, saturating; an all-zero group gets scale code 0, a group holding NaN/Inf code 255.

    x: CPU tensor, float32 / bfloat16 / float16, rank 1..6, any strides (read in place).
    elem_dtype: torch.float8_e4m3fn or torch.float8_e5m2. scale_rule: "nki" | "ocp" | "rceil".
    Returns (data, scales): data of x's shape and dtype elem_dtype; scales torch.float8_e8m0fnu of x's shape with
    axis replaced by ceil(len/32) (for axis=-1 the layout torchao's MXTensor.from_qdata_and_scales takes).
    out: optional (data, scales) tensors of those shapes (scales float8_e8m0fnu or uint8 codes), written in place
    and returned. Not differentiable. Errors: TypeError / ValueError naming the parameter, MXFP8Error from the
    library (nothing is written on error)."""
    B.check_tensor(x, "x", B.FLOAT)
    if elem_dtype not in B.FLOAT8:
        raise ValueError(f"elem_dtype: {elem_dtype!r} is not torch.float8_e4m3fn or torch.float8_e5m2")
    if x.dim() == 0:
        raise ValueError("x: quantization needs a tensor of rank >= 1")
    ax = _norm_axis(axis, x.dim())
    if out is None:
        return torch.ops.mxfp8.quantize(x, ax, elem_dtype, scale_rule, group)
    data, scales = out
    B.check_out(data, "out[0] (data)", x.shape, (elem_dtype,))
    B.check_out(scales, "out[1] (scales)", _scales_shape(x.shape, ax), (torch.float8_e8m0fnu, torch.uint8))
    torch.ops.mxfp8.quantize_out(x, ax, elem_dtype, scale_rule, group, data, scales)
    return data, scales


@_lib.custom_op("mxfp8::dequantize", mutates_args=())
def _dequantize(data: Tensor, scales: Tensor, axis: int, group: str, output_dtype: torch.dtype) -> Tensor:
    out = torch.empty(data.shape, dtype=output_dtype)
    B.dequantize_into(data, scales, axis, group, out)
    return out


@_dequantize.register_fake
def _(data, scales, axis, group, output_dtype):
    return data.new_empty(data.shape, dtype=output_dtype)


@_lib.custom_op("mxfp8::dequantize_out", mutates_args=("out",))
def _dequantize_out(data: Tensor, scales: Tensor, axis: int, group: str, out: Tensor) -> None:
    B.dequantize_into(data, scales, axis, group, out)


@_dequantize_out.register_fake
def _(data, scales, axis, group, out):
    return None


def dequantize(data, scales, axis=-1, group="1x32", output_dtype=torch.float32, *, out=None):
    """out = fp8(data) * 2^(scale - 127) (OCP MX v1.0 section 6.2), exact in float32 (rounded RNE to bfloat16 /
    float16); scale code 255 gives NaN. data: torch.float8_e4m3fn / float8_e5m2 codes; scales: float8_e8m0fnu (or
    uint8 codes) as returned by quantize for the same axis and group. output_dtype: float32, bfloat16 or float16.
    out: optional tensor of data's shape (its dtype decides), written in place and returned."""
    B.check_tensor(data, "data", B.FLOAT8)
    B.check_tensor(scales, "scales", (torch.float8_e8m0fnu, torch.uint8))
    if data.dim() == 0:
        raise ValueError("data: dequantization needs a tensor of rank >= 1")
    ax = _norm_axis(axis, data.dim())
    if out is None:
        if output_dtype not in B.FLOAT:
            raise ValueError(f"output_dtype: {output_dtype!r} is not float32, bfloat16 or float16")
        return torch.ops.mxfp8.dequantize(data, scales, ax, group, output_dtype)
    B.check_out(out, "out", data.shape, B.FLOAT)
    torch.ops.mxfp8.dequantize_out(data, scales, ax, group, out)
    return out


# ---------------------------------------------------------------------------------------------------------------
# linear
# ---------------------------------------------------------------------------------------------------------------
def _rows(t, width):
    """2-D [M, width] view of an N-D tensor (leading dims flattened; a copy only where the strides force one)."""
    M = math.prod(t.shape[:-1])
    try:
        return t.view(M, width)
    except RuntimeError:
        return t.reshape(M, width)


def _out_rows(t, width, name):
    """2-D [M, width] view of an output tensor: it must be one (the library writes into it in place)."""
    try:
        return t.view(math.prod(t.shape[:-1]), width)
    except RuntimeError:
        raise ValueError(f"{name}: its strides do not allow viewing it as a 2-D [rows, {width}] tensor") from None


def _linear_impl(input, weight, bias, elem_dtype, scale_rule, out):
    N, K = weight.shape
    x2 = _rows(input, K)
    o2 = _out_rows(out, N, "out")
    # the library adds the bias to each FP32 sum and rounds once to the output dtype (mxfp8_linear)
    B.linear_into(x2, weight, bias, elem_dtype, scale_rule, o2)


@_lib.custom_op("mxfp8::linear", mutates_args=())
def _linear(input: Tensor, weight: Tensor, bias: Optional[Tensor], elem_dtype: torch.dtype,
            scale_rule: str) -> Tensor:
    out = _buffers.empty((*input.shape[:-1], weight.shape[0]), input.dtype)
    _linear_impl(input, weight, bias, elem_dtype, scale_rule, out)
    return out


@_linear.register_fake
def _(input, weight, bias, elem_dtype, scale_rule):
    return input.new_empty((*input.shape[:-1], weight.shape[0]))


@_lib.custom_op("mxfp8::linear_out", mutates_args=("out",))
def _linear_out(input: Tensor, weight: Tensor, bias: Optional[Tensor], elem_dtype: torch.dtype, scale_rule: str,
                out: Tensor) -> None:
    _linear_impl(input, weight, bias, elem_dtype, scale_rule, out)


@_linear_out.register_fake
def _(input, weight, bias, elem_dtype, scale_rule, out):
    return None


def _linear_backward_impl(grad_output, input, weight, elem_dtype, scale_rule, grad_input, grad_weight):
    N, K = weight.shape
    dy2, x2 = _rows(grad_output, N), _rows(input, K)
    gi2 = _out_rows(grad_input, K, "grad_input")
    if gi2.dtype == grad_weight.dtype or grad_weight.dtype == torch.float32:
        # the library rounds each gradient once to its own dtype; an FP32 weight gradient (FP32 master weights) may
        # sit beside a BF16/F16 input gradient
        B.matmul_backward_into(dy2, weight, x2, elem_dtype, scale_rule, gi2, grad_weight)
        return
    # a BF16/F16 weight gradient beside an input gradient of another dtype: compute in FP32 and round each once to
    # its own dtype (RNE from the FP32 result, the same rounding the library applies)
    gi_acc = gi2 if gi2.dtype == torch.float32 else _buffers.empty(gi2.shape, torch.float32)
    gw_acc = grad_weight if grad_weight.dtype == torch.float32 else _buffers.empty(grad_weight.shape, torch.float32)
    B.matmul_backward_into(dy2, weight, x2, elem_dtype, scale_rule, gi_acc, gw_acc)
    if gi_acc is not gi2:
        gi2.copy_(gi_acc)
    if gw_acc is not grad_weight:
        grad_weight.copy_(gw_acc)


def _bias_grad(grad_output, bias_dtype):
    """sum of dY over every row (mxfp8_bias_grad: FP32 in one fixed order, rounded once to the bias dtype)."""
    dy2 = _rows(grad_output, grad_output.shape[-1])
    gb = _buffers.empty((dy2.shape[1],), bias_dtype)
    vdy, vgb = B.view(dy2, "grad_output"), B.view(gb, "grad_bias")
    B.invoke("mxfp8_bias_grad", ctypes.byref(vdy), ctypes.byref(vgb))
    return gb


@_lib.custom_op("mxfp8::linear_backward", mutates_args=())
def _linear_backward(grad_output: Tensor, input: Tensor, weight: Tensor, elem_dtype: torch.dtype, scale_rule: str,
                     bias_dtype: Optional[torch.dtype]) -> tuple[Tensor, Tensor, Tensor]:
    gi = _buffers.empty(input.shape, input.dtype)
    gw = _buffers.empty(weight.shape, weight.dtype)
    _linear_backward_impl(grad_output, input, weight, elem_dtype, scale_rule, gi, gw)
    gb = torch.empty(0) if bias_dtype is None else _bias_grad(grad_output, bias_dtype)
    return gi, gw, gb


@_linear_backward.register_fake
def _(grad_output, input, weight, elem_dtype, scale_rule, bias_dtype):
    gb = input.new_empty((0,), dtype=torch.float32) if bias_dtype is None else \
        input.new_empty((weight.shape[0],), dtype=bias_dtype)
    return input.new_empty(input.shape), weight.new_empty(weight.shape), gb


@_lib.custom_op("mxfp8::linear_backward_out", mutates_args=("grad_input", "grad_weight"))
def _linear_backward_out(grad_output: Tensor, input: Tensor, weight: Tensor, elem_dtype: torch.dtype,
                         scale_rule: str, grad_input: Tensor, grad_weight: Tensor) -> None:
    _linear_backward_impl(grad_output, input, weight, elem_dtype, scale_rule, grad_input, grad_weight)


@_linear_backward_out.register_fake
def _(grad_output, input, weight, elem_dtype, scale_rule, grad_input, grad_weight):
    return None


def _linear_setup(ctx, inputs, output):
    input, weight, bias, elem_dtype, scale_rule = inputs
    ctx.save_for_backward(input, weight)
    ctx.elem_dtype, ctx.scale_rule = elem_dtype, scale_rule
    ctx.bias_dtype = None if bias is None else bias.dtype


def _linear_grad(ctx, grad_output):
    input, weight = ctx.saved_tensors
    gi, gw, gb = torch.ops.mxfp8.linear_backward(grad_output, input, weight, ctx.elem_dtype, ctx.scale_rule,
                                                 ctx.bias_dtype)
    return gi, gw, (None if ctx.bias_dtype is None else gb), None, None


_linear.register_autograd(_linear_grad, setup_context=_linear_setup)


def _check_linear(input, weight, bias):
    B.check_tensor(input, "input", B.FLOAT)
    B.check_tensor(weight, "weight", B.FLOAT, ndim=2)
    if input.dim() < 1 or input.shape[-1] != weight.shape[1]:
        raise ValueError(f"input: last dimension must be in_features = {weight.shape[1]} (weight is "
                         f"[out_features, in_features] = {tuple(weight.shape)}), got shape {tuple(input.shape)}")
    if bias is not None:
        B.check_tensor(bias, "bias", B.FLOAT, ndim=1)
        if bias.shape[0] != weight.shape[0]:
            raise ValueError(f"bias: expected shape ({weight.shape[0]},), got {tuple(bias.shape)}")


def _autocast(t):
    """Under torch.autocast on the CPU, activations enter in the autocast dtype (as torch's own linear does)."""
    if torch.is_autocast_enabled("cpu"):
        dt = torch.get_autocast_dtype("cpu")
        if t.dtype != dt and t.dtype in B.FLOAT:
            return t.to(dt)
    return t


def linear(input, weight, bias=None, recipe="mxfp8", *, out=None):
    """MXFP8 linear layer y = input @ weight^T + bias (torch.nn.functional.linear's contract), the
    NKI kernels matmul_mxfp8 / matmul_mxfp8_backward.

    input [..., in_features], weight [out_features, in_features], bias [out_features] or None: CPU tensors of
    float32 / bfloat16 / float16 (dtypes may differ), any strides. The forward quantizes input and weight along
    in_features; the backward (autograd) runs matmul_mxfp8_backward: dX = dY @ W (dY, W quantized along
    out_features), dW = dY^T @ X (dY, X quantized along the rows); the bias gradient is the sum of dY over the
    rows in FP32 in one fixed order (mxfp8.bias_grad), rounded once. Element dtype and scale rule come from `recipe` (a name in RECIPES or an MXFP8Recipe; linear_dtype).
    Each GEMM accumulates in FP32 and rounds once: y has input's dtype (under CPU autocast, the autocast dtype),
    the bias is added in FP32 before that rounding; gradients have the dtypes of input and weight.
    out: optional tensor [..., out_features] (viewable as 2-D) written in place and returned, not differentiable.
    Errors: TypeError / ValueError naming the parameter; MXFP8Error from the library."""
    r = get_recipe(recipe)
    _check_linear(input, weight, bias)
    input = _autocast(input)
    if out is None:
        return torch.ops.mxfp8.linear(input, weight, bias, r.linear_dtype, r.scale_rule)
    B.check_out(out, "out", (*input.shape[:-1], weight.shape[0]), B.FLOAT)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (input, weight, bias)):
        raise RuntimeError("linear: out= does not support automatic differentiation, but an input requires grad "
                           "(call it under torch.no_grad(), or without out=)")
    torch.ops.mxfp8.linear_out(input, weight, bias, r.linear_dtype, r.scale_rule, out)
    return out


def linear_backward(grad_output, input, weight, recipe="mxfp8", *, grad_input=None, grad_weight=None):
    """The backward of `linear` as a function (the NKI kernel matmul_mxfp8_backward): returns (grad_input [..., K]
    in input's dtype, grad_weight [N, K] in weight's dtype). grad_input / grad_weight: optional tensors (e.g. a
    parameter's .grad) written in place, overwritten, and returned; give both or neither. grad_output
    [..., out_features], input, weight and recipe as for `linear`. The bias gradient is grad_output summed over the
    rows (not computed here)."""
    r = get_recipe(recipe)
    _check_linear(input, weight, None)
    B.check_tensor(grad_output, "grad_output", B.FLOAT)
    if tuple(grad_output.shape) != (*input.shape[:-1], weight.shape[0]):
        raise ValueError(f"grad_output: expected shape {(*input.shape[:-1], weight.shape[0])}, got "
                         f"{tuple(grad_output.shape)}")
    if (grad_input is None) != (grad_weight is None):
        raise ValueError("grad_input, grad_weight: give both output tensors or neither")
    if grad_input is None:
        gi, gw, _ = torch.ops.mxfp8.linear_backward(grad_output, input, weight, r.linear_dtype, r.scale_rule, None)
        return gi, gw
    B.check_out(grad_input, "grad_input", input.shape, B.FLOAT)
    B.check_out(grad_weight, "grad_weight", weight.shape, B.FLOAT)
    torch.ops.mxfp8.linear_backward_out(grad_output, input, weight, r.linear_dtype, r.scale_rule, grad_input,
                                        grad_weight)
    return grad_input, grad_weight
