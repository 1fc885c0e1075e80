"""Zero-copy bridge between torch tensors and libmxfp8 views, and the eager calls the custom ops run.

A torch tensor becomes an ``mxfp8_tensor`` view with no copy: data pointer ``t.data_ptr()`` (storage offset
included), shape ``t.shape``, strides ``t.stride()`` (torch strides are already in elements, as the C API wants).
The C library accepts any strides for inputs and any strides that address distinct elements for outputs, so
transposed, sliced and expanded tensors go in as they are.

    torch dtype            mxfp8_dtype          torch dtype            mxfp8_dtype
    torch.float32          F32                  torch.float8_e8m0fnu   E8M0 (scale codes)
    torch.bfloat16         BF16                 torch.uint8            U8
    torch.float16          F16                  torch.int32            I32 (ids)
    torch.float8_e4m3fn    E4M3                 torch.int64            ids only: converted once to int32
    torch.float8_e5m2      E5M2                                        (range-checked; the C API takes int32)

Every check here names the parameter: a CUDA (or any non-CPU) tensor, a sparse tensor, a dtype the parameter does
not take, a rank above 6. Functions ending in ``_into`` write into output tensors the caller allocated (torch.empty);
on any error the library writes nothing. All C calls go through ``invoke`` (one place to observe them).
"""

import ctypes
import math

import torch

from .. import _lib
from .. import matmul as _mm
from .. import moe as _moe

FLOAT = (torch.float32, torch.bfloat16, torch.float16)
FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)
IDS = (torch.int32, torch.int64)

CODE = {
    torch.float32: _lib.F32, torch.bfloat16: _lib.BF16, torch.float16: _lib.F16,
    torch.float8_e4m3fn: _lib.E4M3, torch.float8_e5m2: _lib.E5M2, torch.float8_e8m0fnu: _lib.E8M0,
    torch.uint8: _lib.U8, torch.int32: _lib.I32,
}
FORMAT_OF = {torch.float8_e4m3fn: 0, torch.float8_e5m2: 1}  # element dtype -> mxfp8_format

# A valid address for views of empty tensors (torch gives data_ptr() == 0 when numel == 0; the library rejects NULL
# data but never reads or writes an empty view).
_EMPTY = ctypes.create_string_buffer(64)


def _dtype_names(dtypes):
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def check_tensor(t, name, dtypes=None, ndim=None):
    """Raise a clear error unless `t` is a strided CPU torch.Tensor of one of `dtypes` (and rank `ndim`, an int or a
    tuple of ints). Works on fake tensors too (only metadata is read)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu" and t.device.type != "meta":
        raise ValueError(f"{name}: tensor is on {t.device}; mxfp8 runs on the CPU (move it with .cpu())")
    if t.layout != torch.strided:
        raise ValueError(f"{name}: layout {t.layout} is not supported (expected a dense, strided tensor)")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name}: dtype {str(t.dtype).replace('torch.', '')} is not accepted (expected one of "
                        f"{_dtype_names(dtypes)})")
    if ndim is not None:
        ok = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.dim() not in ok:
            want = " or ".join(f"{d}-D" for d in ok)
            raise ValueError(f"{name}: expected a {want} tensor, got shape {tuple(t.shape)}")
    if t.dim() > _lib.MAX_DIMS:
        raise ValueError(f"{name}: rank {t.dim()} exceeds the library's maximum rank {_lib.MAX_DIMS}")


def check_out(t, name, shape, dtypes):
    """Checks of an output tensor given by the caller (out=): CPU, dtype, exact shape, not requiring grad."""
    check_tensor(t, name, dtypes)
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(t.shape)}")
    if t.requires_grad and torch.is_grad_enabled():
        raise RuntimeError(f"{name}: an out= tensor that requires grad cannot be written (out= variants do not "
                           f"support automatic differentiation)")


def check_ids(t, name):
    """An id tensor (token or expert ids): int32 or int64, CPU, and never requiring grad."""
    if isinstance(t, torch.Tensor) and t.requires_grad:
        raise ValueError(f"{name}: an id tensor cannot require grad")
    check_tensor(t, name, IDS)


def view(t, name="tensor", code=None):
    """An mxfp8 view of CPU tensor `t` (no copy). `code` overrides the dtype code (e.g. U8 for uint8 scales)."""
    check_tensor(t, name)
    if t.device.type != "cpu":
        raise ValueError(f"{name}: tensor is on {t.device}; the library needs CPU memory")
    if code is None:
        code = CODE.get(t.dtype)
        if code is None:
            raise TypeError(f"{name}: dtype {t.dtype} has no mxfp8 equivalent")
    if t.is_neg() or t.is_conj():
        raise ValueError(f"{name}: resolve the lazy negation/conjugation first (t.resolve_neg())")
    v = _lib.Tensor()
    ptr = t.data_ptr()
    v.data = ptr if ptr else ctypes.addressof(_EMPTY)
    v.dtype = code
    v.ndim = t.dim()
    for i, (n, s) in enumerate(zip(t.shape, t.stride())):
        v.shape[i] = n
        v.strides[i] = s
    return v


def opt_view(t, name):
    return _lib.none() if t is None else view(t, name)


def invoke(name, *args):
    """Call C function `name` (raises MXFP8Error on a non-zero status)."""
    _lib.call(name, *args)


def ids_to_int32(t, name):
    """int32 copy of an int64 id tensor (values must fit int32, else ValueError naming `name`); int32 as is."""
    check_ids(t, name)
    if t.dtype == torch.int32:
        return t
    if t.numel():
        lo, hi = int(t.min()), int(t.max())
        if lo < -2**31 or hi > 2**31 - 1:
            raise ValueError(f"{name}: value {lo if lo < -2**31 else hi} does not fit int32 (the library's id type)")
    return t.to(torch.int32)


def num_blocks(T, top_k, num_experts, block_size):
    """N = ceil((T*K - (E-1)) / B) + E - 1, ceil rounding toward zero (mxfp8_moe_num_blocks); pure Python so that
    fake (symbolic) sizes work."""
    if top_k < 1 or num_experts < 1 or block_size < 1 or top_k > num_experts:
        raise ValueError(f"route: need 1 <= top_k <= num_experts and block_size >= 1 (got top_k={top_k}, "
                         f"num_experts={num_experts}, block_size={block_size})")
    num = T * top_k - (num_experts - 1)
    ceil = (num + block_size - 1) // block_size if num > 0 else -((-num) // block_size)
    return ceil + num_experts - 1


# ---- quantization ----
def quantize_into(x, axis, elem_dtype, scale_rule, group, data, scales):
    params = _lib.QuantParams(FORMAT_OF[elem_dtype], _lib.parse(_lib.SCALE_RULES, scale_rule, "scale_rule"),
                              _lib.parse(_lib.GROUPS, group, "group"))
    vx, vd, vs = view(x, "x"), view(data, "data"), view(scales, "scales")
    invoke("mxfp8_quantize", _lib.ref(vx), axis, _lib.ref(params), _lib.ref(vd), _lib.ref(vs))


def dequantize_into(data, scales, axis, group, out):
    vd, vs, vo = view(data, "data"), view(scales, "scales"), view(out, "out")
    invoke("mxfp8_dequantize", _lib.ref(vd), _lib.ref(vs), axis, _lib.parse(_lib.GROUPS, group, "group"),
           _lib.ref(vo))


# ---- linear ----
def _matmul_config(elem_dtype, scale_rule):
    c = _mm._Config()
    _lib.function("mxfp8_matmul_config_init")(ctypes.byref(c))
    c.float8_dtype = FORMAT_OF[elem_dtype]
    c.scale_rule = _lib.parse(_lib.SCALE_RULES, scale_rule, "scale_rule")
    c.workspace = _lib.workspace()  # the calling thread's scratch, kept across calls (speed only)
    return c


def linear_into(x2, w, bias, elem_dtype, scale_rule, out2):
    """out2 [M, N] = x2 [M, K] @ w [N, K]^T + bias [N] (mxfp8_linear: the FP32 sum plus the bias in one FP32
    addition, rounded once to out2's dtype); bias None: mxfp8_matmul's result."""
    a, b = _mm._Operand(), _mm._Operand()
    a.values, b.values = view(x2, "input"), view(w, "weight")
    c = _matmul_config(elem_dtype, scale_rule)
    vb, vo = opt_view(bias, "bias"), view(out2, "out")
    invoke("mxfp8_linear", ctypes.byref(a), ctypes.byref(b), ctypes.byref(vb), ctypes.byref(c), ctypes.byref(vo))


def matmul_backward_into(dy2, w, x2, elem_dtype, scale_rule, dx2, dw):
    """dx2 [M, K] = dy2 [M, N] @ w [N, K]; dw [N, K] = dy2^T @ x2 [M, K] (mxfp8_matmul_backward); dw of dx2's float
    dtype or float32."""
    a = _mm._BwdArgs()
    _lib.function("mxfp8_matmul_bwd_args_init")(ctypes.byref(a))
    a.output_grad = view(dy2, "grad_output")
    a.weights = view(w, "weight")
    a.input_activation = view(x2, "input")
    a.float8_dtype = FORMAT_OF[elem_dtype]
    a.output_dtype = CODE[dx2.dtype]
    a.scale_rule = _lib.parse(_lib.SCALE_RULES, scale_rule, "scale_rule")
    a.workspace = _lib.workspace()
    vdx, vdw = view(dx2, "grad_input"), view(dw, "grad_weight")
    invoke("mxfp8_matmul_backward", ctypes.byref(a), ctypes.byref(vdx), ctypes.byref(vdw))


# ---- router linear (batch-invariant FP32 fmaf chains, no quantization) ----
def router_linear_into(x2, weight, bias, logits):
    """logits [T, E] (float32) = x2 [T, H] @ weight [E, H]^T (+ bias [E]) (mxfp8_router_linear)."""
    vx, vw, vb, vo = view(x2, "input"), view(weight, "weight"), opt_view(bias, "bias"), view(logits, "logits")
    invoke("mxfp8_router_linear", ctypes.byref(vx), ctypes.byref(vw), ctypes.byref(vb), ctypes.byref(vo),
           _lib.workspace())


def router_linear_input_grad_into(dl2, weight, accumulate, dx2):
    """dx2 [T, H] (=, or += with accumulate) dl2 [T, E] @ weight [E, H] (mxfp8_router_linear_input_grad)."""
    vd, vw, vo = view(dl2, "grad_logits"), view(weight, "weight"), view(dx2, "grad_input")
    invoke("mxfp8_router_linear_input_grad", ctypes.byref(vd), ctypes.byref(vw), int(bool(accumulate)),
           ctypes.byref(vo), _lib.workspace())


def router_linear_weight_grad_into(dl2, x2, accumulate, dw):
    """dw [E, H] (=, or += with accumulate) dl2 [T, E]^T @ x2 [T, H] (mxfp8_router_linear_weight_grad)."""
    vd, vx, vo = view(dl2, "grad_logits"), view(x2, "input"), view(dw, "grad_weight")
    invoke("mxfp8_router_linear_weight_grad", ctypes.byref(vd), ctypes.byref(vx), int(bool(accumulate)),
           ctypes.byref(vo), _lib.workspace())


# ---- MoE ----
_MOE_DECLARED = False


def _moe_declare():
    global _MOE_DECLARED
    if not _MOE_DECLARED:
        _moe._declare()
        for name in ("mxfp8_moe_fwd_args_init", "mxfp8_moe_bwd_args_init"):
            _lib.declare(name, None, [ctypes.c_void_p])
        _MOE_DECLARED = True


def route_into(ids32, weights, num_experts, block_size, skip_token, tp, be, a):
    _moe_declare()
    pad = -1 if skip_token else ids32.shape[0]
    vi, vw = view(ids32, "topk_ids"), view(weights, "topk_weights")
    vt, vb, va = view(tp, "token_position_to_id"), view(be, "block_to_expert"), view(a, "expert_affinities_masked")
    invoke("mxfp8_moe_route", _lib.ref(vi), _lib.ref(vw), int(num_experts), int(block_size), pad, _lib.ref(vt),
           _lib.ref(vb), _lib.ref(va))


def moe_config(activation, clamp_limits, affinity_option, elem_dtype, scale_rule, skip_token, bias,
               swiglu=(1.702, 7.0), rounding=(0, 0)):
    """The C mxfp8_moe_config of the layer (through the numpy package's MXFP8MOEBwdConfig, which validates);
    swiglu = [alpha, limit], rounding = [stochastic-rounding operand bitmask, seed as a signed 64-bit int]."""
    gl, gu, ul, uu = (None if math.isinf(v) else v for v in clamp_limits)
    cfg = _moe.MXFP8MOEBwdConfig(
        activation_type=activation, affinity_option=affinity_option,
        fp8_x4_dtype={torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2"}[elem_dtype],
        scale_rule=scale_rule, bias=bool(bias), skip_dma=_moe.SkipMode(skip_token=bool(skip_token)),
        clamp_limits=_moe.ClampLimits(non_linear_clamp_lower_limit=gl, non_linear_clamp_upper_limit=gu,
                                      linear_clamp_lower_limit=ul, linear_clamp_upper_limit=uu),
        swiglu_alpha=float(swiglu[0]), swiglu_limit=float(swiglu[1]), stochastic_rounding=int(rounding[0]),
        rounding_seed=int(rounding[1]) & ((1 << 64) - 1))
    return cfg._to_c()


def _fill_moe_inputs(args, cc, inputs):
    """Set the fields the forward and backward argument structs share from the dict `inputs`."""
    for name in ("hidden_states", "expert_affinities_masked", "gate_up_proj_weight", "down_proj_weight",
                 "token_position_to_id", "block_to_expert"):
        setattr(args, name, view(inputs[name], name))
    args.gate_and_up_proj_bias = opt_view(inputs.get("gate_and_up_proj_bias"), "gate_and_up_proj_bias")
    args.down_proj_bias = opt_view(inputs.get("down_proj_bias"), "down_proj_bias")
    args.block_size = int(inputs["block_size"])
    args.config = ctypes.pointer(cc)
    args.workspace = _lib.workspace()


def moe_forward_validate(cc, inputs):
    """The library's checks of mxfp8_moe_forward on `inputs` (mxfp8_moe_forward_validate: the call's status and
    message as an MXFP8Error, nothing written), with a stand-in output of the call's shape and dtype (allocated,
    never touched)."""
    _moe_declare()
    a = _moe._FwdArgs()
    _lib.function("mxfp8_moe_fwd_args_init")(ctypes.byref(a))
    _fill_moe_inputs(a, cc, inputs)
    x = inputs["hidden_states"]
    out = torch.empty(tuple(x.shape), dtype=x.dtype)
    o = _moe._FwdOutputs()
    o.output = view(out, "output")
    invoke("mxfp8_moe_forward_validate", ctypes.byref(a), ctypes.byref(o), None)


def moe_forward_into(cc, inputs, output, gate_up_ckpt, down_out_ckpt):
    """mxfp8_moe_forward: output [T, H]; checkpoints (each when not None) gate_up_proj_act_checkpoint_T [N, 2, I, B] and
    down_proj_output_checkpoint [N, B, H]."""
    _moe_declare()
    a = _moe._FwdArgs()
    _lib.function("mxfp8_moe_fwd_args_init")(ctypes.byref(a))
    _fill_moe_inputs(a, cc, inputs)
    o = _moe._FwdOutputs()
    o.output = view(output, "output")
    o.gate_up_proj_act_checkpoint_T = opt_view(gate_up_ckpt, "gate_up_proj_act_checkpoint_T")
    o.down_proj_output_checkpoint = opt_view(down_out_ckpt, "down_proj_output_checkpoint")
    invoke("mxfp8_moe_forward", ctypes.byref(a), ctypes.byref(o))


def moe_backward_into(cc, inputs, grad_output, gate_up_ckpt, down_out_ckpt, grads):
    """mxfp8_moe_backward into `grads` (a dict of the six gradient names, bias ones absent without bias)."""
    _moe_declare()
    a = _moe._BwdArgs()
    _lib.function("mxfp8_moe_bwd_args_init")(ctypes.byref(a))
    _fill_moe_inputs(a, cc, inputs)
    a.output_hidden_states_grad = view(grad_output, "grad_output")
    a.gate_up_proj_act_checkpoint_T = opt_view(gate_up_ckpt, "gate_up_proj_act_checkpoint_T")
    a.down_proj_output_checkpoint = opt_view(down_out_ckpt, "down_proj_output_checkpoint")
    g = _moe._BwdGrads()
    for name in _moe._GRAD_NAMES:
        setattr(g, name, opt_view(grads.get(name), name))
    invoke("mxfp8_moe_backward", ctypes.byref(a), ctypes.byref(g))
