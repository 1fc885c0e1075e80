"""Configuration of the blockwise MoE kernels: MXFP8MOEBwdConfig (with the field names of the NKI API reference
nkilib.experimental.moe_mxfp8), ClampLimits, SkipMode, and the ctypes mirror of the C struct mxfp8_moe_config.
Import them from ``mxfp8`` (``mxfp8.MXFP8MOEBwdConfig``).
"""

import ctypes
import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from . import _lib
from .matmul import MatmulMxfp8KernelConfig, _Config as _MatmulConfig

__all__ = ["MXFP8MOEBwdConfig", "ClampLimits", "SkipMode", "MOE_OPERANDS"]

ACTIVATIONS = _lib.ACTIVATIONS  # the library's names (mxfp8_enum_name), read when first used
# The GEMM operands of the layer (mxfp8_moe_operand), for MXFP8MOEBwdConfig.stochastic_rounding and the statistics
MOE_OPERANDS = _lib.MOE_OPERANDS
# Named sets of operands: the gradients (what stochastic rounding is usually for) and everything
OPERAND_SETS = {"gradients": ("p1_dy", "p2_dgu", "p3_dgu", "p4_dy"), "all": MOE_OPERANDS}
AFFINITY = _lib.AFFINITY
SHARD = {"shard_on_free": 0, "shard_on_block": 1, "shard_on_intermediate": 2, "shard_on_i": 2}
COMPUTE = {"bfloat16": _lib.BF16, "bf16": _lib.BF16, "float32": _lib.F32, "f32": _lib.F32}


_DECLARED = False


def _declare():
    """Declare the C signatures of the MoE entry points (once)."""
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


# ---- C mirror (field for field with mxfp8.h) ----
class _MoeConfig(ctypes.Structure):
    _c_name = "mxfp8_moe_config"
    _fields_ = [("compute_dtype", ctypes.c_int), ("quant_dtype", ctypes.c_int), ("scale_rule", ctypes.c_int),
                ("activation", ctypes.c_int), ("affinity_option", ctypes.c_int),
                ("phase1", _MatmulConfig), ("phase2", _MatmulConfig), ("phase3", _MatmulConfig),
                ("phase4", _MatmulConfig), ("gate_clamp_lower", ctypes.c_float),
                ("gate_clamp_upper", ctypes.c_float), ("up_clamp_lower", ctypes.c_float),
                ("up_clamp_upper", ctypes.c_float), ("skip_token", ctypes.c_int),
                ("accumulate_hidden_states_grad", ctypes.c_int), ("skip_grad_initialization", ctypes.c_int),
                ("single_expert_dense", ctypes.c_int), ("bias", ctypes.c_int),
                ("swiglu_alpha", ctypes.c_float), ("swiglu_limit", ctypes.c_float),
                ("stochastic_rounding", ctypes.c_uint32), ("rounding_seed", ctypes.c_uint64),
                # hardware-only knobs (validated, no effect), grouped at the end as in the C struct
                ("shard_option", ctypes.c_int), ("p3_transpose_mode", ctypes.c_int),
                ("p4_transpose_mode", ctypes.c_int), ("hidden_states_swizzle_mode", ctypes.c_int),
                ("output_grad_swizzle_mode", ctypes.c_int), ("weight_swizzle_mode", ctypes.c_int),
                ("skip_weight", ctypes.c_int), ("use_fast_dma", ctypes.c_int)]



# ---- configuration ----
@dataclass(frozen=True)
class ClampLimits:
    """Clamp limits of MXFP8MOEBwdConfig.clamp_limits, with the NKI names (floats; None = no limit; NaN is an
    error). linear_clamp_lower_limit / linear_clamp_upper_limit clamp the up projection u,
    non_linear_clamp_lower_limit / non_linear_clamp_upper_limit the gate projection g (the one that goes through the
    activation). The forward clips to [lower, upper]; the backward's masks are strict (lower < x < upper), so a
    value exactly at a limit gets zero gradient. lower > upper raises MXFP8Error."""
    linear_clamp_upper_limit: Optional[float] = None
    linear_clamp_lower_limit: Optional[float] = None
    non_linear_clamp_upper_limit: Optional[float] = None
    non_linear_clamp_lower_limit: Optional[float] = None


@dataclass(frozen=True)
class SkipMode:
    """MXFP8MOEBwdConfig.skip_dma, with the NKI names. skip_token: padding positions of token_position_to_id hold -1
    (True, the default) or T, the index of an implicit zero row (False). skip_weight: Trainium-only (validated, no
    effect)."""
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
    """MXFP8MOEBwdConfig of the NKI API: every non-tensor knob of the blockwise MoE kernels, with the NKI field
    names. Used by blockwise_mm_bwd_mxfp8, blockwise_mm_fwd_mxfp8 and both goldens (None there = MXFP8MOEBwdConfig()).

    compute_dtype : "bfloat16" (default) | "float32"
        Accepted; intermediates are FP32 on a CPU either way (at least bfloat16's precision).
    fp8_x4_dtype : "float8_e4m3fn" (default; "float8_e4m3fn_x4" accepted) | "float8_e5m2"
        Element format of every GEMM operand (E5M2 is an mxfp8 addition: the NKI kernel is E4M3 only).
    activation_type : "silu" (default) | "swish" (x * sigmoid(1.702 x)) | "squared_relu" (max(x, 0)^2) |
        "gpt_oss_swiglu" (gpt-oss: inter = g * sigmoid(alpha g) * (u + 1), g clamped above at limit, u to
        [-limit, limit]; the limits act as clamp limits, with the strict gradient masks)
        Or an enum member with one of these names (as NKI's ActFnType).
    swiglu_alpha : float (default 1.702), swiglu_limit : float > 0 (default 7.0; math.inf = none)
        gpt_oss_swiglu's alpha and limit (an mxfp8 addition).
    stochastic_rounding : iterable of operand names from MOE_OPERANDS, "gradients" (p1_dy, p2_dgu, p3_dgu, p4_dy),
        "all", or an int bitmask; default () = round to nearest
        GEMM operands whose elements are rounded stochastically (an mxfp8 addition; see mxfp8.h, mxfp8_moe_operand,
        for each operand's stream and logical index).
    rounding_seed : int in [0, 2**64) (default 0)
        The key of stochastic rounding (use a new one per training step).
    affinity_option : "affinity_on_i" (default) | "affinity_on_h"
        Where the affinity enters the backward: it scales the intermediate (Phase 1 / 4) or dY.
    phase1_config, phase2_config, phase3_config, phase4_config : MatmulMxfp8KernelConfig or None
        Accepted for the NKI API; each phase uses the GEMM's automatic blocking (speed only). quant_scheme must be
        "1x32" (MoE groups are 1x32; "wrapx" raises MXFP8Error); element format, scale rule and accumulation come
        from this config.
    accumulate_hidden_states_grad : bool
        hidden_states_grad = the given buffer + the gradient (pass hidden_states_grad=... to the backward).
    skip_grad_initialization : bool
        Weight and bias gradients = the given buffers + the gradients (pass the *_grad buffers).
    single_expert_dense : bool (default False; the NKI kernel's default is True)
        E must be 1 and routing is the identity: position p of block n holds token n * B + p, N = ceil(T / B);
        token_position_to_id and block_to_expert are ignored.
    clamp_limits : ClampLimits, a dict of its fields, or None
        Clamps of g and u (None = no limits; anything else, a tuple for one, is a TypeError).
    skip_dma : SkipMode or None (= SkipMode(): padding id -1)
    bias : bool
        The layer has biases (pass gate_and_up_proj_bias / down_proj_bias; absent = zero); the backward then also
        returns their gradients.
    scale_rule : "nki" (default) | "ocp" | "rceil"
        E8M0 rule of every quantization (an mxfp8 addition).
    shard_option ("shard_on_free" | "shard_on_block" | "shard_on_intermediate"), fast_dma_transpose,
    pe_transpose_only, phase3_transpose_mode / phase4_transpose_mode ("nc" | "pe" | "dma") and the *_swizzle_mode
    fields ("pe" | "dgt" | "dma")
        Trainium-only knobs: validated, no effect on results.
    Flags take a bool or 0/1; any other value raises TypeError / ValueError naming the field (config.<field>)."""
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
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    stochastic_rounding: object = ()
    rounding_seed: int = 0

    def _rounding_mask(self):
        v = self.stochastic_rounding
        if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            if not 0 <= int(v) < 1 << len(MOE_OPERANDS):
                raise ValueError(f"config.stochastic_rounding: {int(v)} has bits beyond the {len(MOE_OPERANDS)} "
                                 "operands")
            return int(v)
        names = OPERAND_SETS.get(v, (v,)) if isinstance(v, str) else v
        mask = 0
        for n in names:
            for m in OPERAND_SETS.get(n, (n,)) if isinstance(n, str) else (n,):
                if m not in MOE_OPERANDS:
                    raise ValueError(f"config.stochastic_rounding: unknown operand {m!r} (expected names from "
                                     f"{MOE_OPERANDS}, 'gradients' or 'all')")
                mask |= 1 << MOE_OPERANDS.index(m)
        return mask

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
        cl = self.clamp_limits
        if cl is None:
            cl = ClampLimits()
        elif isinstance(cl, dict):  # the field names as keys, as mxfp8.torch takes them
            unknown = sorted(set(cl) - {f.name for f in dataclasses.fields(ClampLimits)})
            if unknown:
                raise ValueError(f"config.clamp_limits: unknown field(s) {unknown} (the fields of mxfp8.ClampLimits: "
                                 f"{', '.join(f.name for f in dataclasses.fields(ClampLimits))})")
            cl = ClampLimits(**cl)
        elif not isinstance(cl, ClampLimits):
            raise TypeError(f"config.clamp_limits: expected an mxfp8.ClampLimits, a dict of its fields or None, "
                            f"got {type(cl).__name__} {cl!r}")

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
        c.swiglu_alpha = float(self.swiglu_alpha)
        c.swiglu_limit = float(self.swiglu_limit)
        c.stochastic_rounding = self._rounding_mask()
        c.rounding_seed = _lib.parse_seed(self.rounding_seed, "config.rounding_seed")
        _lib.parse_bool(self.pe_transpose_only, "config.pe_transpose_only")  # hardware-only: validated, unused
        return c

    def padding_id(self, T):
        """The padding position id of this config for T tokens: -1 with skip_dma.skip_token, else T."""
        return -1 if (self.skip_dma or SkipMode()).skip_token else int(T)
