"""Blockwise Mixture-of-Experts in MXFP8 (NKI nkilib.experimental.moe_mxfp8: blockwise_mm_bwd_mxfp8), the forward
that makes its checkpoints, the router helper and the FP64 golden references.

    token_position_to_id, block_to_expert, expert_affinities_masked = mxfp8.route(topk_ids, topk_weights,
                                                                                  num_experts, block_size)
    output, checkpoints = mxfp8.blockwise_mm_fwd_mxfp8(hidden_states, expert_affinities_masked, gate_up_proj_weight,
                                                       down_proj_weight, token_position_to_id, block_to_expert,
                                                       block_size, checkpoints="all")
    grads = mxfp8.blockwise_mm_bwd_mxfp8(hidden_states, expert_affinities_masked, gate_up_proj_weight,
                                         down_proj_weight, token_position_to_id, block_to_expert,
                                         output_hidden_states_grad, block_size, **checkpoints)
    # grads = (hidden_states_grad, expert_affinities_masked_grad, gate_up_proj_weight_grad, down_proj_weight_grad
    #          [, gate_and_up_proj_bias_grad, down_proj_bias_grad])

The layer (X = hidden_states [T, H], W1 = gate_up_proj_weight [E, H, 2, I], W2 = down_proj_weight [E, I, H],
a = expert_affinities_masked [T*E, 1]; blocks of B positions, block n belongs to expert block_to_expert[n], position
p holds token token_position_to_id[n*B + p] or padding):
    g = clamp(X[t] @ W1[e][:, 0] + b1[e, 0]); u = clamp(X[t] @ W1[e][:, 1] + b1[e, 1]); inter = act(g) * u
    output[t] += a[t*E + e] * (inter @ W2[e] + b2[e])
The backward is its exact derivative with MXFP8 GEMMs, each quantizing both operands along its own contraction axis
(Phase 1 dY @ W2^T along H, Phase 2 dGU @ W1^T along 2I, Phases 3/4 weight gradients along the block's positions).
Everything about precision, checkpoints, padding conventions and the deviations from the seed page is documented in
include/mxfp8.h ("Blockwise MoE"); in short: any B, H, I >= 1 and T >= 0; optional biases are inputs of both
passes (keyword-only); single_expert_dense defaults to False here (upstream True); padding id is -1 with
skip_dma.skip_token (our default) and T otherwise; down_proj_output_checkpoint (keyword-only) is our forward
checkpoint for the AFFINITY_ON_H affinity gradient. Errors of the library raise MXFP8Error (status, message).
"""

import ctypes
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from . import _lib
from .matmul import MatmulMxfp8KernelConfig, _Config as _MatmulConfig

__all__ = ["MXFP8MOEBwdConfig", "ClampLimits", "SkipMode", "route", "num_blocks", "blockwise_mm_fwd_mxfp8",
           "blockwise_mm_bwd_mxfp8", "blockwise_mm_fwd_golden", "blockwise_mm_bwd_golden", "MOE_CHECKPOINTS"]

ACTIVATIONS = {"silu": 0, "swish": 1, "squared_relu": 2, "squaredrelu": 2, "relu2": 2}
AFFINITY = {"affinity_on_i": 0, "on_i": 0, "i": 0, "affinity_on_h": 1, "on_h": 1, "h": 1}
SHARD = {"shard_on_free": 0, "shard_on_block": 1, "shard_on_intermediate": 2, "shard_on_i": 2}
COMPUTE = {"bfloat16": _lib.BF16, "bf16": _lib.BF16, "float32": _lib.F32, "f32": _lib.F32}
MOE_CHECKPOINTS = ("gate_up_proj_act_checkpoint_T", "gate_act_checkpoint_T", "intermediate_checkpoint_T",
                   "scaled_intermediate_checkpoint_T", "down_proj_output_checkpoint")
_FLOAT = (_lib.F32, _lib.BF16, _lib.F16)
_GOLD = (_lib.F32, _lib.F64)


# ---- C mirrors (field for field with include/mxfp8.h) ----
class _MoeConfig(ctypes.Structure):
    _fields_ = [("compute_dtype", ctypes.c_int), ("quant_dtype", ctypes.c_int), ("scale_rule", ctypes.c_int),
                ("activation", ctypes.c_int), ("affinity_option", ctypes.c_int),
                ("phase1", _MatmulConfig), ("phase2", _MatmulConfig), ("phase3", _MatmulConfig),
                ("phase4", _MatmulConfig), ("gate_clamp_lower", ctypes.c_float),
                ("gate_clamp_upper", ctypes.c_float), ("up_clamp_lower", ctypes.c_float),
                ("up_clamp_upper", ctypes.c_float), ("skip_token", ctypes.c_int),
                ("accumulate_hidden_states_grad", ctypes.c_int), ("skip_grad_initialization", ctypes.c_int),
                ("single_expert_dense", ctypes.c_int), ("bias", ctypes.c_int),
                # hardware-only knobs (validated, no effect), grouped at the end as in the C struct
                ("shard_option", ctypes.c_int), ("p3_transpose_mode", ctypes.c_int),
                ("p4_transpose_mode", ctypes.c_int), ("hidden_states_swizzle_mode", ctypes.c_int),
                ("output_grad_swizzle_mode", ctypes.c_int), ("weight_swizzle_mode", ctypes.c_int),
                ("skip_weight", ctypes.c_int), ("use_fast_dma", ctypes.c_int)]


_T = _lib.Tensor


class _FwdArgs(ctypes.Structure):
    _fields_ = [("hidden_states", _T), ("expert_affinities_masked", _T), ("gate_up_proj_weight", _T),
                ("down_proj_weight", _T), ("token_position_to_id", _T), ("block_to_expert", _T),
                ("block_size", ctypes.c_int64), ("gate_and_up_proj_bias", _T), ("down_proj_bias", _T),
                ("config", ctypes.POINTER(_MoeConfig)), ("gate_up_weight_scales", _T), ("down_weight_scales", _T),
                ("num_valid_tokens", _T), ("workspace", ctypes.c_void_p)]


class _FwdOutputs(ctypes.Structure):
    _fields_ = [("output", _T)] + [(n, _T) for n in MOE_CHECKPOINTS]


class _BwdArgs(ctypes.Structure):
    _fields_ = [("hidden_states", _T), ("expert_affinities_masked", _T), ("gate_up_proj_weight", _T),
                ("down_proj_weight", _T), ("token_position_to_id", _T), ("block_to_expert", _T),
                ("output_hidden_states_grad", _T), ("block_size", ctypes.c_int64),
                ("gate_up_proj_act_checkpoint_T", _T), ("gate_act_checkpoint_T", _T),
                ("intermediate_checkpoint_T", _T), ("scaled_intermediate_checkpoint_T", _T),
                ("down_proj_act_checkpoint", _T), ("down_proj_output_checkpoint", _T),
                ("gate_and_up_proj_bias", _T), ("down_proj_bias", _T), ("config", ctypes.POINTER(_MoeConfig)),
                ("gate_up_weight_scales", _T), ("down_weight_scales", _T), ("num_valid_tokens", _T),
                ("workspace", ctypes.c_void_p)]


_GRAD_NAMES = ("hidden_states_grad", "expert_affinities_masked_grad", "gate_up_proj_weight_grad",
               "down_proj_weight_grad", "gate_and_up_proj_bias_grad", "down_proj_bias_grad")


class _BwdGrads(ctypes.Structure):
    _fields_ = [(n, _T) for n in _GRAD_NAMES]


_DECLARED = False


def _declare():
    global _DECLARED
    if _DECLARED:
        return
    P, I = ctypes.c_void_p, ctypes.c_int
    for name, res, args in (("mxfp8_moe_forward", I, [P, P]), ("mxfp8_moe_backward", I, [P, P]),
                            ("mxfp8_moe_forward_golden", I, [P, P, I]), ("mxfp8_moe_backward_golden", I, [P, P, I]),
                            ("mxfp8_moe_config_init", None, [P]),
                            ("mxfp8_moe_num_blocks", I, [ctypes.c_int64] * 4 + [P]),
                            ("mxfp8_moe_route", I, [P, P, ctypes.c_int64, ctypes.c_int64, ctypes.c_int32, P, P,
                                                    P])):
        _lib.declare(name, res, args)
    _DECLARED = True


# ---- configuration ----
@dataclass(frozen=True)
class ClampLimits:
    """Clamp limits of the NKI page (None = no limit). linear = the up projection u, non_linear = the gate
    projection g (the one that goes through the activation). The forward clips to [lower, upper]; the backward's
    masks are strict (lower < x < upper), so a value exactly at a limit gets zero gradient."""
    linear_clamp_upper_limit: Optional[float] = None
    linear_clamp_lower_limit: Optional[float] = None
    non_linear_clamp_upper_limit: Optional[float] = None
    non_linear_clamp_lower_limit: Optional[float] = None


@dataclass(frozen=True)
class SkipMode:
    """skip_token: padding positions hold -1 (True) or T, the index of an implicit zero row (False).
    skip_weight: hardware-only (no effect)."""
    skip_token: bool = True
    skip_weight: bool = False


# Hardware-only knobs (no effect on results), validated: the names of the NKI kernel's modes, exact (lower-case)
TRANSPOSE_MODES = {"nc": 0, "pe": 1, "dma": 2}      # phase3/4_transpose_mode (C p3/p4_transpose_mode)
SWIZZLE_MODES = {"pe": 0, "dgt": 1, "dma": 2}       # every *_swizzle_mode (C *_swizzle_mode)
SWIZZLE_FIELDS = ("output_grad_swizzle_mode", "down_weight_swizzle_mode", "d_gate_up_swizzle_mode",
                  "gate_up_weight_swizzle_mode", "d_gate_up_t_swizzle_mode", "hidden_states_t_swizzle_mode",
                  "output_grad_t_swizzle_mode", "scaled_intermediate_t_swizzle_mode")


def _name(value):
    """Lower-case name of a string or an Enum member (its name)."""
    if isinstance(value, str):
        return value.strip().lower()
    n = getattr(value, "name", None)
    return n.lower() if isinstance(n, str) else value


@dataclass
class MXFP8MOEBwdConfig:
    """MXFP8MOEBwdConfig [NKI-E] (also used by the forward and the goldens), with the seed's field names.

    compute_dtype: "bfloat16" (default) or "float32" -- accepted; intermediates are FP32 on a CPU.
    fp8_x4_dtype: element format of every GEMM operand: "float8_e4m3fn" (default; "float8_e4m3fn_x4" accepted) or
        "float8_e5m2" (ours: the upstream kernel is E4M3 only).
    activation_type: "silu" (default), "swish" (x*sigmoid(1.702x)) or "squared_relu" (or ActFnType-like enums).
    affinity_option: "affinity_on_i" (default) or "affinity_on_h".
    phase1_config..phase4_config: MatmulMxfp8KernelConfig or None; blocking only (element format, scale rule and
        output dtype come from this config); quant_scheme "wrapx" is unsupported (MoE groups are 1x32).
    accumulate_hidden_states_grad: hidden_states_grad = given buffer + gradient (pass hidden_states_grad=...).
    skip_grad_initialization: weight/bias grads = given buffers + gradients (pass the *_grad buffers).
    single_expert_dense: E = 1 identity routing, N = ceil(T/B) (default False here; upstream True).
    clamp_limits: ClampLimits or None. skip_dma: SkipMode or None (= SkipMode(): skip_token True, padding -1).
    bias: the layer has biases (pass gate_and_up_proj_bias / down_proj_bias, absent = 0); bias grads returned.
    shard_option, fast_dma_transpose, pe_transpose_only, phase3/4_transpose_mode ("nc" | "pe" | "dma") and the
        *_swizzle_mode fields ("pe" | "dgt" | "dma") are hardware knobs: validated, no effect on results. Flags take
        a bool or 0/1 (anything else is an error).
    scale_rule (ours): "nki" (default), "ocp" or "rceil"."""
    compute_dtype: object = "bfloat16"
    fp8_x4_dtype: object = "float8_e4m3fn"
    activation_type: object = "silu"
    shard_option: object = "shard_on_free"
    affinity_option: object = "affinity_on_i"
    phase1_config: Optional[MatmulMxfp8KernelConfig] = None
    phase2_config: Optional[MatmulMxfp8KernelConfig] = None
    phase3_config: Optional[MatmulMxfp8KernelConfig] = None
    phase4_config: Optional[MatmulMxfp8KernelConfig] = None
    accumulate_hidden_states_grad: bool = False
    skip_grad_initialization: bool = False
    single_expert_dense: bool = False
    fast_dma_transpose: bool = False
    pe_transpose_only: bool = False
    clamp_limits: Optional[ClampLimits] = None
    skip_dma: Optional[SkipMode] = None
    bias: bool = False
    phase3_transpose_mode: object = "nc"
    phase4_transpose_mode: object = "nc"
    output_grad_swizzle_mode: object = "pe"
    down_weight_swizzle_mode: object = "pe"
    d_gate_up_swizzle_mode: object = "pe"
    gate_up_weight_swizzle_mode: object = "pe"
    d_gate_up_t_swizzle_mode: object = "pe"
    hidden_states_t_swizzle_mode: object = "pe"
    output_grad_t_swizzle_mode: object = "pe"
    scaled_intermediate_t_swizzle_mode: object = "pe"
    scale_rule: str = "nki"

    def _fmt(self):
        v = self.fp8_x4_dtype
        if isinstance(v, str) and v.endswith("_x4"):
            v = v[:-3]
        return _lib.parse_format(v, "config.fp8_x4_dtype", _lib.FLOAT8_DTYPES)

    def _to_c(self):
        _declare()
        c = _MoeConfig()
        _lib.function("mxfp8_moe_config_init")(ctypes.byref(c))
        cd = self.compute_dtype
        if not isinstance(cd, str):
            try:
                cd = {np.dtype(np.float32): "float32"}.get(np.dtype(cd), "bfloat16" if "bfloat16" in str(cd) else cd)
            except TypeError:
                cd = str(cd)
        c.compute_dtype = _lib.parse(COMPUTE, cd, "config.compute_dtype")
        fmt = self._fmt()
        c.quant_dtype = fmt
        c.scale_rule = _lib.parse(_lib.SCALE_RULES, self.scale_rule, "config.scale_rule")
        act = _name(self.activation_type)
        c.activation = _lib.parse(ACTIVATIONS, act, "config.activation_type")
        sh = _name(self.shard_option)
        c.shard_option = _lib.parse(SHARD, sh, "config.shard_option") if isinstance(sh, str) else int(sh)
        c.affinity_option = _lib.parse(AFFINITY, _name(self.affinity_option), "config.affinity_option")
        for i, pc in enumerate((self.phase1_config, self.phase2_config, self.phase3_config, self.phase4_config)):
            if pc is None:
                continue
            if not isinstance(pc, MatmulMxfp8KernelConfig):
                raise TypeError(f"config.phase{i + 1}_config must be a MatmulMxfp8KernelConfig or None")
            group = _lib.parse(_lib.GROUPS, pc.quant_scheme, f"config.phase{i + 1}_config.quant_scheme") \
                if pc.quant_scheme is not None else 0
            mc = pc._to_c(fmt, c.scale_rule, group, _lib.F32 if pc.output_dtype is None else
                          _lib.parse_out_dtype(pc.output_dtype), f"config.phase{i + 1}_config")
            setattr(c, f"phase{i + 1}", mc)
        modes = {f: _lib.parse(TRANSPOSE_MODES, _name(getattr(self, f)), "config." + f)
                 for f in ("phase3_transpose_mode", "phase4_transpose_mode")}
        modes.update({f: _lib.parse(SWIZZLE_MODES, _name(getattr(self, f)), "config." + f) for f in SWIZZLE_FIELDS})
        c.p3_transpose_mode = modes["phase3_transpose_mode"]
        c.p4_transpose_mode = modes["phase4_transpose_mode"]
        c.hidden_states_swizzle_mode = modes["hidden_states_t_swizzle_mode"]
        c.output_grad_swizzle_mode = modes["output_grad_swizzle_mode"]
        c.weight_swizzle_mode = modes["gate_up_weight_swizzle_mode"]
        cl = self.clamp_limits or ClampLimits()

        def lim(v, default, name):
            if v is None:
                return default
            v = float(v)
            if math.isnan(v):
                raise ValueError(f"config.clamp_limits.{name} is NaN")
            return v
        c.gate_clamp_lower = lim(cl.non_linear_clamp_lower_limit, -math.inf, "non_linear_clamp_lower_limit")
        c.gate_clamp_upper = lim(cl.non_linear_clamp_upper_limit, math.inf, "non_linear_clamp_upper_limit")
        c.up_clamp_lower = lim(cl.linear_clamp_lower_limit, -math.inf, "linear_clamp_lower_limit")
        c.up_clamp_upper = lim(cl.linear_clamp_upper_limit, math.inf, "linear_clamp_upper_limit")
        sk = self.skip_dma or SkipMode()
        c.skip_token = _lib.parse_bool(sk.skip_token, "config.skip_dma.skip_token")
        c.skip_weight = _lib.parse_bool(sk.skip_weight, "config.skip_dma.skip_weight")
        c.accumulate_hidden_states_grad = _lib.parse_bool(self.accumulate_hidden_states_grad,
                                                          "config.accumulate_hidden_states_grad")
        c.skip_grad_initialization = _lib.parse_bool(self.skip_grad_initialization, "config.skip_grad_initialization")
        c.single_expert_dense = _lib.parse_bool(self.single_expert_dense, "config.single_expert_dense")
        c.bias = _lib.parse_bool(self.bias, "config.bias")
        c.use_fast_dma = _lib.parse_bool(self.fast_dma_transpose, "config.fast_dma_transpose")
        _lib.parse_bool(self.pe_transpose_only, "config.pe_transpose_only")  # hardware-only: validated, unused
        return c

    def padding_id(self, T):
        """The padding position id of this config for T tokens: -1 with skip_dma.skip_token, else T."""
        return -1 if (self.skip_dma or SkipMode()).skip_token else int(T)


# ---- helpers ----
def _arr(x, name, allowed=_FLOAT, ndim=None):
    a = _lib.as_array(x, allowed, name)
    if ndim is not None and a.ndim not in ((ndim,) if isinstance(ndim, int) else ndim):
        raise ValueError(f"{name}: expected a {ndim}-D array, got shape {a.shape}")
    return a


def _i32(x, name):
    """int32 array of an integer array-like (int64 values must fit)."""
    a = np.asarray(x)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected an integer array, got dtype {a.dtype}")
    if a.dtype != np.int32:
        if a.size and (a.min() < -2**31 or a.max() > 2**31 - 1):
            raise ValueError(f"{name}: values do not fit int32")
        a = a.astype(np.int32)
    return a


def _opt_view(x, name, allowed=_FLOAT):
    if x is None:
        return _lib.none()
    return _lib.view(_arr(x, name, allowed))


def _weight_view(w, name):
    a = _lib.as_array(w, _FLOAT + (_lib.E4M3, _lib.E5M2, _lib.U8), name)
    return _lib.view(a)


def _scales_view(s, name):
    if s is None:
        return _lib.none()
    a = np.asarray(s)
    return _lib.view(a, _lib.U8 if a.dtype == np.uint8 else None)


def _config(config):
    if config is None:
        config = MXFP8MOEBwdConfig()
    if not isinstance(config, MXFP8MOEBwdConfig):
        raise TypeError("config must be an MXFP8MOEBwdConfig or None")
    return config, config._to_c()


def _nvt(num_valid_tokens):
    if num_valid_tokens is None:
        return _lib.none()
    return _lib.view(_i32(np.asarray(num_valid_tokens).reshape(-1), "num_valid_tokens"))


def _routing(token_position_to_id, block_to_expert):
    tp = _lib.none() if token_position_to_id is None else \
        _lib.view(_i32(np.asarray(token_position_to_id).reshape(-1), "token_position_to_id"))
    be = _lib.none() if block_to_expert is None else _lib.view(_i32(block_to_expert, "block_to_expert"))
    return tp, be


def num_blocks(T, top_k, num_experts, block_size):
    """N = ceil((T*top_k - (E-1)) / B) + E - 1 (the upstream routing convention)."""
    _declare()
    n = ctypes.c_int64()
    _lib.call("mxfp8_moe_num_blocks", int(T), int(top_k), int(num_experts), int(block_size), ctypes.byref(n))
    return n.value


def route(topk_ids, topk_weights, num_experts, block_size, padding_id=-1, affinity_dtype=np.float32):
    """Block layout of a top-K routing (the upstream test convention): returns (token_position_to_id [N*B] int32,
    block_to_expert [N, 1] int32, expert_affinities_masked [T*E, 1] of affinity_dtype). Expert e gets
    ceil(count_e/B) blocks in expert order with its tokens ascending, padded with padding_id (-1, or T for the
    zero-row convention); leftover blocks are all padding and belong to expert E-1. topk_ids [T, K] (distinct per
    row, in [0, E)), topk_weights [T, K] (float32/bfloat16/float16)."""
    _declare()
    ids = _i32(topk_ids, "topk_ids")
    w = _lib.as_array(topk_weights, _FLOAT, "topk_weights")
    if ids.ndim != 2:
        raise ValueError(f"topk_ids: expected [T, K], got shape {ids.shape}")
    T, K = ids.shape
    N = num_blocks(T, K, num_experts, block_size)
    tp = np.empty(N * int(block_size), np.int32)
    be = np.empty((N, 1), np.int32)
    adt = np.dtype(affinity_dtype)
    if _lib.dtype_code(adt) not in _FLOAT + (_lib.F64,):
        raise TypeError(f"affinity_dtype: {adt} is not float32, bfloat16, float16 or float64")
    a = np.empty((T * int(num_experts), 1), adt)
    vi, vw, vt, vb, va = _lib.view(ids), _lib.view(w), _lib.view(tp), _lib.view(be), _lib.view(a)
    _lib.call("mxfp8_moe_route", ctypes.byref(vi), ctypes.byref(vw), int(num_experts), int(block_size),
              int(padding_id), ctypes.byref(vt), ctypes.byref(vb), ctypes.byref(va))
    return tp, be, a


def _dims(hidden_states, gate_up_proj_weight, token_position_to_id, block_size, cfg):
    X = np.asarray(hidden_states)
    W1 = np.asarray(gate_up_proj_weight)
    if X.ndim != 2 or W1.ndim != 4:
        raise ValueError(f"hidden_states must be [T, H] and gate_up_proj_weight [E, H, 2, I] (got {X.shape}, "
                         f"{W1.shape})")
    T, H = X.shape
    E, I = W1.shape[0], W1.shape[3]
    B = int(block_size)
    if cfg.single_expert_dense:
        N = -(-T // B) if B > 0 else 0
    else:
        N = (np.asarray(token_position_to_id).size // B) if B > 0 else 0
    return T, H, E, I, B, N


def _out_dtype(x, dtype, name):
    if dtype is None:
        dt = np.asarray(x).dtype
        return dt if _lib.dtype_code(dt) in _FLOAT else np.dtype(np.float32)
    return _lib.np_dtype(_lib.parse_out_dtype(dtype, name))


def _fill_common(a, cc, B, hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
                 token_position_to_id, block_to_expert, gate_and_up_proj_bias, down_proj_bias, gate_up_weight_scales,
                 down_weight_scales, num_valid_tokens):
    """Fill the fields the forward and backward argument structs share (same names in both)."""
    a.hidden_states = _lib.view(_arr(hidden_states, "hidden_states"))
    a.expert_affinities_masked = _lib.view(_arr(expert_affinities_masked, "expert_affinities_masked"))
    a.gate_up_proj_weight = _weight_view(gate_up_proj_weight, "gate_up_proj_weight")
    a.down_proj_weight = _weight_view(down_proj_weight, "down_proj_weight")
    a.token_position_to_id, a.block_to_expert = _routing(token_position_to_id, block_to_expert)
    a.block_size = B
    a.gate_and_up_proj_bias = _opt_view(gate_and_up_proj_bias, "gate_and_up_proj_bias")
    a.down_proj_bias = _opt_view(down_proj_bias, "down_proj_bias")
    a.config = ctypes.pointer(cc)
    a.gate_up_weight_scales = _scales_view(gate_up_weight_scales, "gate_up_weight_scales")
    a.down_weight_scales = _scales_view(down_weight_scales, "down_weight_scales")
    a.num_valid_tokens = _nvt(num_valid_tokens)


def _fwd_call(fn, hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
              token_position_to_id, block_to_expert, block_size, config, gate_up_weight_scales, down_weight_scales,
              num_valid_tokens, gate_and_up_proj_bias, down_proj_bias, checkpoints, out_dtype, ck_dtype, extra):
    cfg, cc = _config(config)
    T, H, E, I, B, N = _dims(hidden_states, gate_up_proj_weight, token_position_to_id, block_size, cfg)
    a = _FwdArgs()
    _fill_common(a, cc, B, hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
                 token_position_to_id, block_to_expert, gate_and_up_proj_bias, down_proj_bias, gate_up_weight_scales,
                 down_weight_scales, num_valid_tokens)
    if checkpoints == "all":
        checkpoints = MOE_CHECKPOINTS
    checkpoints = tuple(checkpoints or ())
    shapes = {"gate_up_proj_act_checkpoint_T": (N, 2, I, B), "gate_act_checkpoint_T": (N, I, B),
              "intermediate_checkpoint_T": (N, I, B), "scaled_intermediate_checkpoint_T": (N, I, B),
              "down_proj_output_checkpoint": (N, B, H)}
    o = _FwdOutputs()
    y = np.empty((T, H), out_dtype)
    o.output = _lib.view(y)
    cks = {}
    for name in checkpoints:
        if name not in shapes:
            raise ValueError(f"checkpoints: unknown checkpoint {name!r} (expected names from {MOE_CHECKPOINTS})")
        cks[name] = np.empty(shapes[name], ck_dtype)
        setattr(o, name, _lib.view(cks[name]))
    _lib.call(fn, ctypes.byref(a), ctypes.byref(o), *extra)
    return y, cks


def blockwise_mm_fwd_mxfp8(hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
                           token_position_to_id, block_to_expert, block_size=4096, config=None,
                           gate_up_weight_scales=None, down_weight_scales=None, num_valid_tokens=None, *,
                           gate_and_up_proj_bias=None, down_proj_bias=None,
                           checkpoints=("gate_up_proj_act_checkpoint_T",), output_dtype=None,
                           checkpoint_dtype=np.float32):
    """MXFP8 forward of the layer. Returns (output [T, H], {checkpoint name: array}) with the checkpoints named in
    `checkpoints` ("all" = MOE_CHECKPOINTS; shapes [N, 2, I, B], [N, I, B] x3, down_proj_output_checkpoint
    [N, B, H]; 0 at padding positions). output_dtype: default hidden_states' dtype. Pre-quantized weights use the
    forward's axes: gate_up_proj_weight codes quantized along H with gate_up_weight_scales [E, ceil(H/32), 2, I],
    down_proj_weight codes along I with down_weight_scales [E, ceil(I/32), H] (mxfp8.quantize(w, axis=1))."""
    _declare()
    return _fwd_call("mxfp8_moe_forward", hidden_states, expert_affinities_masked, gate_up_proj_weight,
                     down_proj_weight, token_position_to_id, block_to_expert, block_size, config,
                     gate_up_weight_scales, down_weight_scales, num_valid_tokens, gate_and_up_proj_bias,
                     down_proj_bias, checkpoints, _out_dtype(hidden_states, output_dtype, "output_dtype"),
                     np.dtype(checkpoint_dtype), ())


def blockwise_mm_fwd_golden(hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
                            token_position_to_id, block_to_expert, block_size=4096, config=None,
                            gate_up_weight_scales=None, down_weight_scales=None, num_valid_tokens=None, *,
                            gate_and_up_proj_bias=None, down_proj_bias=None, quantized=False,
                            checkpoints=()):
    """FP64 golden forward (float64 output and checkpoints): unquantized, or (quantized=True) with every GEMM
    operand MX-quantized along its contraction axis and the GEMM in FP64."""
    _declare()
    return _fwd_call("mxfp8_moe_forward_golden", hidden_states, expert_affinities_masked, gate_up_proj_weight,
                     down_proj_weight, token_position_to_id, block_to_expert, block_size, config,
                     gate_up_weight_scales, down_weight_scales, num_valid_tokens, gate_and_up_proj_bias,
                     down_proj_bias, checkpoints, np.dtype(np.float64), np.dtype(np.float64),
                     (_lib.parse_bool(quantized, "quantized"),))


def _bwd_call(fn, extra, grad_dtype, hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
              token_position_to_id, block_to_expert, output_hidden_states_grad, block_size, cks, config,
              gate_up_weight_scales, down_weight_scales, num_valid_tokens, gate_and_up_proj_bias, down_proj_bias,
              given):
    cfg, cc = _config(config)
    T, H, E, I, B, N = _dims(hidden_states, gate_up_proj_weight, token_position_to_id, block_size, cfg)
    a = _BwdArgs()
    _fill_common(a, cc, B, hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
                 token_position_to_id, block_to_expert, gate_and_up_proj_bias, down_proj_bias, gate_up_weight_scales,
                 down_weight_scales, num_valid_tokens)
    a.output_hidden_states_grad = _lib.view(_arr(output_hidden_states_grad, "output_hidden_states_grad"))
    for name, v in cks.items():
        setattr(a, name, _opt_view(v, name))
    shapes = ((T, H), (T * E, 1), (E, H, 2, I), (E, I, H), (E, 2, I), (E, H))
    g = _BwdGrads()
    out = []
    n_out = 6 if cfg.bias else 4
    for k in range(n_out):
        buf = given.get(_GRAD_NAMES[k])
        if buf is not None:
            if not isinstance(buf, np.ndarray) or buf.shape != shapes[k] and not (k == 1 and buf.shape == (T * E,)):
                raise ValueError(f"{_GRAD_NAMES[k]}: expected a numpy array of shape {shapes[k]}")
            if not buf.flags.writeable:
                raise ValueError(f"{_GRAD_NAMES[k]}: the buffer is read-only")
            arr = buf
        else:
            arr = np.zeros(shapes[k], grad_dtype)
        out.append(arr)
        v = _lib.view(arr)
        if v.array is not arr:
            raise ValueError(f"{_GRAD_NAMES[k]}: the buffer must have element-aligned strides")
        setattr(g, _GRAD_NAMES[k], v)
    _lib.call(fn, ctypes.byref(a), ctypes.byref(g), *extra)
    return tuple(out)


def blockwise_mm_bwd_mxfp8(hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
                           token_position_to_id, block_to_expert, output_hidden_states_grad, block_size=4096,
                           gate_up_proj_act_checkpoint_T=None, gate_act_checkpoint_T=None,
                           intermediate_checkpoint_T=None, scaled_intermediate_checkpoint_T=None,
                           down_proj_act_checkpoint=None, config=None, gate_up_weight_scales=None,
                           down_weight_scales=None, num_valid_tokens=None, *, down_proj_output_checkpoint=None,
                           gate_and_up_proj_bias=None, down_proj_bias=None, grad_dtype=None,
                           hidden_states_grad=None, gate_up_proj_weight_grad=None, down_proj_weight_grad=None,
                           gate_and_up_proj_bias_grad=None, down_proj_bias_grad=None):
    """blockwise_mm_bwd_mxfp8 [NKI-E]: returns (hidden_states_grad [T, H], expert_affinities_masked_grad [T*E, 1],
    gate_up_proj_weight_grad [E, H, 2, I], down_proj_weight_grad [E, I, H]) plus (gate_and_up_proj_bias_grad
    [E, 2, I], down_proj_bias_grad [E, H]) when config.bias.

    Checkpoints are optional (recomputed per block when absent; F32 checkpoints from blockwise_mm_fwd_mxfp8 give
    bitwise the same result). Pre-quantized weights use the backward's axes: gate_up_proj_weight codes quantized
    along 2I (mxfp8.quantize(W1.reshape(E, H, 2*I), axis=2)) with gate_up_weight_scales [E, H, ceil(2I/32)],
    down_proj_weight codes along H with down_weight_scales [E, I, ceil(H/32)]. num_valid_tokens (needs
    config.single_expert_dense): rows / entries past the count are 0.
    Keyword-only (ours): down_proj_output_checkpoint, the biases, grad_dtype (default hidden_states' dtype) and
    output buffers (*_grad=...) that config.accumulate_hidden_states_grad / skip_grad_initialization add into
    (they are written in place and returned)."""
    _declare()
    cks = dict(gate_up_proj_act_checkpoint_T=gate_up_proj_act_checkpoint_T,
               gate_act_checkpoint_T=gate_act_checkpoint_T, intermediate_checkpoint_T=intermediate_checkpoint_T,
               scaled_intermediate_checkpoint_T=scaled_intermediate_checkpoint_T,
               down_proj_act_checkpoint=down_proj_act_checkpoint,
               down_proj_output_checkpoint=down_proj_output_checkpoint)
    given = dict(hidden_states_grad=hidden_states_grad, gate_up_proj_weight_grad=gate_up_proj_weight_grad,
                 down_proj_weight_grad=down_proj_weight_grad, gate_and_up_proj_bias_grad=gate_and_up_proj_bias_grad,
                 down_proj_bias_grad=down_proj_bias_grad)
    return _bwd_call("mxfp8_moe_backward", (), _out_dtype(hidden_states, grad_dtype, "grad_dtype"), hidden_states,
                     expert_affinities_masked, gate_up_proj_weight, down_proj_weight, token_position_to_id,
                     block_to_expert, output_hidden_states_grad, block_size, cks, config, gate_up_weight_scales,
                     down_weight_scales, num_valid_tokens, gate_and_up_proj_bias, down_proj_bias, given)


def blockwise_mm_bwd_golden(hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
                            token_position_to_id, block_to_expert, output_hidden_states_grad, block_size=4096,
                            config=None, gate_up_weight_scales=None, down_weight_scales=None, num_valid_tokens=None,
                            *, gate_and_up_proj_bias=None, down_proj_bias=None, quantized=False, **given):
    """FP64 golden backward (float64 gradients, same tuple as blockwise_mm_bwd_mxfp8): every intermediate is
    recomputed in FP64 from the inputs (checkpoints are not taken). quantized=False: the unquantized layer (the
    NKI criteria's golden); quantized=True: each GEMM operand MX-quantized along its contraction axis, GEMMs in
    FP64. Output buffers (float64) may be given as keywords as for blockwise_mm_bwd_mxfp8."""
    _declare()
    unknown = set(given) - set(_GRAD_NAMES)
    if unknown:
        raise TypeError(f"blockwise_mm_bwd_golden: unexpected keyword argument(s) {sorted(unknown)}")
    return _bwd_call("mxfp8_moe_backward_golden", (_lib.parse_bool(quantized, "quantized"),), np.dtype(np.float64),
                     hidden_states,
                     expert_affinities_masked, gate_up_proj_weight, down_proj_weight, token_position_to_id,
                     block_to_expert, output_hidden_states_grad, block_size, {}, config, gate_up_weight_scales,
                     down_weight_scales, num_valid_tokens, gate_and_up_proj_bias, down_proj_bias, given)
