"""Blockwise Mixture-of-Experts in MXFP8, with the parameters of the NKI API reference
nkilib.experimental.moe_mxfp8 (blockwise_mm_bwd_mxfp8): the backward, the forward that makes its checkpoints, the
router helper and FP64 golden references.

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

Pass the block_size you routed with to every call: the NKI default, 4096, is far larger than small problems.

The layer. X = hidden_states [T, H], W1 = gate_up_proj_weight [E, H, 2, I] (W1[e][:, 0] the gate projection, W1[e][:, 1]
the up projection), W2 = down_proj_weight [E, I, H], a = expert_affinities_masked [T*E, 1] (a[t*E + e], the weight of
expert e for token t, 0 where t does not route to e), optional biases b1 [E, 2, I], b2 [E, H]. Tokens are processed
in N blocks of B = block_size positions; block n belongs to expert block_to_expert[n]; position p of block n holds
token token_position_to_id[n*B + p] or padding (id -1, or T with SkipMode(skip_token=False)). Per token t routed to e:
    g = clamp(X[t] @ W1[e][:, 0] + b1[e, 0]); u = clamp(X[t] @ W1[e][:, 1] + b1[e, 1]); inter = act(g) * u
    output[t] += a[t*E + e] * (inter @ W2[e] + b2[e])
The backward is its exact derivative with MXFP8 GEMMs, each quantizing both operands (1x32 groups) along its own
contraction axis: Phase 1 dY @ W2^T along H, Phase 2 dGU @ W1^T along 2I, Phases 3 and 4 (weight gradients) along the
block's positions. GEMMs accumulate in FP32; activation and affinity math is FP32; results are bitwise identical for
any thread count.

Dtypes: activations, affinities, high-precision weights, biases and checkpoints are float32, ml_dtypes.bfloat16 or
float16 (the NKI kernel takes bfloat16); float64 arrays, Python numbers and lists are rounded once to float32 (to
nearest even), so results equal those of the float32 values. Token and expert ids are integer arrays (stored as
int32).

Differences from the NKI kernel: any B, H, I >= 1 and T >= 0 (no multiple-of-128 limits); optional biases are inputs
of both passes (keyword-only); single_expert_dense defaults to False (the NKI default True would reject every
multi-expert call); SwiGLU with SiLU, Swish or squared-ReLU; down_proj_output_checkpoint (keyword-only) is a forward
checkpoint for the AFFINITY_ON_H affinity gradient; hardware-only knobs are validated and have no effect. Errors of
the library raise MXFP8Error (status, message); bad option values raise ValueError, bad dtypes TypeError.
"""

import ctypes

import numpy as np

from . import _lib
from .moe_config import (  # noqa: F401 (re-exported: mxfp8.moe keeps its names)
    ACTIVATIONS,
    AFFINITY,
    COMPUTE,
    SHARD,
    SWIZZLE_FIELDS,
    SWIZZLE_MODES,
    TRANSPOSE_MODES,
    ClampLimits,
    MOE_OPERANDS,
    MXFP8MOEBwdConfig,
    SkipMode,
    _declare,
    _MoeConfig,
)

__all__ = ["MXFP8MOEBwdConfig", "ClampLimits", "SkipMode", "MOE_OPERANDS", "route", "num_blocks",
           "blockwise_mm_fwd_mxfp8",
           "blockwise_mm_bwd_mxfp8", "blockwise_mm_fwd_golden", "blockwise_mm_bwd_golden", "MOE_CHECKPOINTS"]

MOE_CHECKPOINTS = ("gate_up_proj_act_checkpoint_T", "gate_act_checkpoint_T", "intermediate_checkpoint_T",
                   "scaled_intermediate_checkpoint_T", "down_proj_output_checkpoint")
_FLOAT = (_lib.F32, _lib.BF16, _lib.F16)

# ---- C mirrors (field for field with mxfp8.h) ----
_T = _lib.Tensor


class _FwdArgs(ctypes.Structure):
    _c_name = "mxfp8_moe_fwd_args"
    _fields_ = [("hidden_states", _T), ("expert_affinities_masked", _T), ("gate_up_proj_weight", _T),
                ("down_proj_weight", _T), ("token_position_to_id", _T), ("block_to_expert", _T),
                ("block_size", ctypes.c_int64), ("gate_and_up_proj_bias", _T), ("down_proj_bias", _T),
                ("config", ctypes.POINTER(_MoeConfig)), ("gate_up_weight_scales", _T), ("down_weight_scales", _T),
                ("num_valid_tokens", _T), ("workspace", ctypes.c_void_p), ("stats", ctypes.c_void_p)]


class _FwdOutputs(ctypes.Structure):
    _c_name = "mxfp8_moe_fwd_outputs"
    _fields_ = [("output", _T)] + [(n, _T) for n in MOE_CHECKPOINTS]


class _BwdArgs(ctypes.Structure):
    _c_name = "mxfp8_moe_bwd_args"
    _fields_ = [("hidden_states", _T), ("expert_affinities_masked", _T), ("gate_up_proj_weight", _T),
                ("down_proj_weight", _T), ("token_position_to_id", _T), ("block_to_expert", _T),
                ("output_hidden_states_grad", _T), ("block_size", ctypes.c_int64),
                ("gate_up_proj_act_checkpoint_T", _T), ("gate_act_checkpoint_T", _T),
                ("intermediate_checkpoint_T", _T), ("scaled_intermediate_checkpoint_T", _T),
                ("down_proj_act_checkpoint", _T), ("down_proj_output_checkpoint", _T),
                ("gate_and_up_proj_bias", _T), ("down_proj_bias", _T), ("config", ctypes.POINTER(_MoeConfig)),
                ("gate_up_weight_scales", _T), ("down_weight_scales", _T), ("num_valid_tokens", _T),
                ("workspace", ctypes.c_void_p), ("stats", ctypes.c_void_p)]


_GRAD_NAMES = ("hidden_states_grad", "expert_affinities_masked_grad", "gate_up_proj_weight_grad",
               "down_proj_weight_grad", "gate_and_up_proj_bias_grad", "down_proj_bias_grad")


class _BwdGrads(ctypes.Structure):
    _c_name = "mxfp8_moe_bwd_grads"
    _fields_ = [(n, _T) for n in _GRAD_NAMES]


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
    """Number of blocks N = ceil((T * top_k - (E - 1)) / B) + E - 1 that `route` lays out (the NKI kernel's
    convention: enough for any routing of T tokens to top_k distinct experts each, one partial block per expert; a
    negative numerator rounds toward zero, so T = 0 with B >= E gives E - 1 padding-only blocks).

    T >= 0 tokens, 1 <= top_k <= num_experts, block_size B >= 1 (ints). Returns an int. Raises MXFP8Error
    (INVALID_ARGUMENT for values out of range, SIZE_OVERFLOW)."""
    _declare()
    n = ctypes.c_int64()
    _lib.call("mxfp8_moe_num_blocks", int(T), int(top_k), int(num_experts), int(block_size), ctypes.byref(n))
    return n.value


def route(topk_ids, topk_weights, num_experts, block_size, padding_id=-1, affinity_dtype=np.float32):
    """Block layout of a top-K routing, as the NKI kernel's tests build it.

    Parameters
    ----------
    topk_ids : integer array [T, K]
        The experts of each token, in [0, num_experts), distinct within a row.
    topk_weights : array [T, K]
        Their weights: float32 / bfloat16 / float16 (float64, numbers and lists are rounded to float32). Copied, not
        normalized.
    num_experts : int E >= K
    block_size : int B >= 1
        Positions per block; pass the same value to blockwise_mm_fwd_mxfp8 / blockwise_mm_bwd_mxfp8.
    padding_id : -1 (default) | T
        Id of padding positions: -1 for the default SkipMode(skip_token=True), T (an implicit zero row) for
        skip_token=False.
    affinity_dtype : float32 (default) | bfloat16 | float16 | float64
        dtype of expert_affinities_masked.

    Returns
    -------
    token_position_to_id : int32 [N * B]
        Expert 0's blocks first, then expert 1's, ...; expert e gets ceil(count_e / B) blocks holding its tokens in
        ascending order, the last one padded with padding_id; the blocks left over up to N = num_blocks(T, K, E, B)
        are all padding.
    block_to_expert : int32 [N, 1]
        The expert of each block (leftover padding-only blocks get expert E - 1).
    expert_affinities_masked : [T * E, 1] of affinity_dtype
        a[t*E + e] = the weight of expert e in row t of topk_weights, 0 where t does not route to e.

    Raises TypeError (dtypes), ValueError (topk_ids not 2-D), MXFP8Error (ids out of range or repeated in a row,
    padding_id not -1 or T, E or B < 1, K > E).
    """
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


def _checkpoint_names(checkpoints):
    """The checkpoint names of the forward's `checkpoints` argument: "all", one name, or an iterable of names."""
    if checkpoints is None:
        return ()
    if isinstance(checkpoints, str):
        return MOE_CHECKPOINTS if checkpoints == "all" else (checkpoints,)
    names = tuple(checkpoints)
    for n in names:
        if not isinstance(n, str):
            raise TypeError(f"checkpoints: expected checkpoint names (str), got {n!r}")
    return names


def _block_size_hint(err, B, token_position_to_id, block_to_expert):
    """`err` (an MXFP8Error of a MoE call) with a hint appended when block_size is the likely cause: the message
    names block_size, or the routing tables imply another block size (N * B' positions for N blocks)."""
    implied = None
    if token_position_to_id is not None and block_to_expert is not None:
        n = np.asarray(block_to_expert).size
        p = np.asarray(token_position_to_id).size
        if n > 0 and p % n == 0:
            implied = p // n
    if "block_size" not in err.message and (implied is None or implied == B):
        return err
    hint = f" (block_size is {B}"
    if B == 4096:
        hint += ", the NKI default, which is far larger than small problems"
    if implied is not None and implied != B:
        hint += (f"; token_position_to_id ({np.asarray(token_position_to_id).size} positions) and block_to_expert "
                 f"({np.asarray(block_to_expert).size} blocks) were built with block_size={implied}")
    hint += ": pass block_size=... with the value given to mxfp8.route)"
    return _lib.MXFP8Error(err.status, err.message + hint)


def _stats_buffer(a, want, E):
    """The args' statistics array (E * 12 structs) when asked for, else None."""
    if not _lib.parse_bool(want, "stats"):
        return None
    st = (_lib.QuantStats * (E * len(MOE_OPERANDS)))()
    a.stats = ctypes.addressof(st)
    return st


def _stats_list(st, E):
    """[expert] -> {operand name (MOE_OPERANDS): statistics dict (see mxfp8.quantize)}."""
    n = len(MOE_OPERANDS)
    return [{name: _lib.stats_dict(st[e * n + i]) for i, name in enumerate(MOE_OPERANDS)} for e in range(E)]


def _call(fn, a, out, extra, B, token_position_to_id, block_to_expert):
    try:
        _lib.call(fn, ctypes.byref(a), ctypes.byref(out), *extra)
    except _lib.MXFP8Error as e:
        raise _block_size_hint(e, B, token_position_to_id, block_to_expert) from None


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


def _put(struct, name, view):
    """struct.name = view, keeping view's array alive as long as the struct: assigning a view to a field copies the
    view's bytes, not its reference to the (possibly converted, temporary) array."""
    setattr(struct, name, view)
    struct.__dict__.setdefault("_keep", []).append(view)


def _fill_common(a, cc, B, hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
                 token_position_to_id, block_to_expert, gate_and_up_proj_bias, down_proj_bias, gate_up_weight_scales,
                 down_weight_scales, num_valid_tokens):
    """Fill the fields the forward and backward argument structs share (same names in both), and the calling
    thread's workspace (scratch memory reused across calls)."""
    a.workspace = _lib.workspace()
    tp, be = _routing(token_position_to_id, block_to_expert)
    for name, v in (("hidden_states", _lib.view(_arr(hidden_states, "hidden_states"))),
                    ("expert_affinities_masked", _lib.view(_arr(expert_affinities_masked,
                                                                "expert_affinities_masked"))),
                    ("gate_up_proj_weight", _weight_view(gate_up_proj_weight, "gate_up_proj_weight")),
                    ("down_proj_weight", _weight_view(down_proj_weight, "down_proj_weight")),
                    ("token_position_to_id", tp), ("block_to_expert", be),
                    ("gate_and_up_proj_bias", _opt_view(gate_and_up_proj_bias, "gate_and_up_proj_bias")),
                    ("down_proj_bias", _opt_view(down_proj_bias, "down_proj_bias")),
                    ("gate_up_weight_scales", _scales_view(gate_up_weight_scales, "gate_up_weight_scales")),
                    ("down_weight_scales", _scales_view(down_weight_scales, "down_weight_scales")),
                    ("num_valid_tokens", _nvt(num_valid_tokens))):
        _put(a, name, v)
    a.block_size = B
    a.config = ctypes.pointer(cc)


def _fwd_call(fn, hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
              token_position_to_id, block_to_expert, block_size, config, gate_up_weight_scales, down_weight_scales,
              num_valid_tokens, gate_and_up_proj_bias, down_proj_bias, checkpoints, out_dtype, ck_dtype, extra,
              stats=False):
    cfg, cc = _config(config)
    T, H, E, I, B, N = _dims(hidden_states, gate_up_proj_weight, token_position_to_id, block_size, cfg)
    a = _FwdArgs()
    _fill_common(a, cc, B, hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
                 token_position_to_id, block_to_expert, gate_and_up_proj_bias, down_proj_bias, gate_up_weight_scales,
                 down_weight_scales, num_valid_tokens)
    st = _stats_buffer(a, stats, E)
    checkpoints = _checkpoint_names(checkpoints)
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
    _call(fn, a, o, extra, B, None if cfg.single_expert_dense else token_position_to_id, block_to_expert)
    if st is not None:
        return y, cks, _stats_list(st, E)
    return y, cks


def blockwise_mm_fwd_mxfp8(hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
                           token_position_to_id, block_to_expert, block_size=4096, config=None,
                           gate_up_weight_scales=None, down_weight_scales=None, num_valid_tokens=None, *,
                           gate_and_up_proj_bias=None, down_proj_bias=None,
                           checkpoints=("gate_up_proj_act_checkpoint_T",), output_dtype=None,
                           checkpoint_dtype=np.float32, stats=False):
    """MXFP8 forward of the blockwise MoE layer (see the module doc), producing the backward's checkpoints.

    GEMM 1: X_blk [B, H] @ W1[e] [H, 2I], both quantized along H; GEMM 2: inter [B, I] @ W2[e] [I, H], both
    quantized along I; the affinity scales the GEMM 2 result in FP32; output accumulates over blocks in FP32 and is
    rounded once.

    Parameters
    ----------
    hidden_states : array [T, H]
        X: float32 / bfloat16 / float16 (float64, numbers and lists are rounded to float32).
    expert_affinities_masked : array [T * E, 1] (or [T * E])
        a, as `route` returns it.
    gate_up_proj_weight : array [E, H, 2, I]
        W1 ([:, :, 0] gate, [:, :, 1] up; see from_mixtral), high precision, or FP8 codes quantized along H (axis 1:
        ``mxfp8.quantize(W1, fmt, axis=1)``) with gate_up_weight_scales [E, ceil(H/32), 2, I].
    down_proj_weight : array [E, I, H]
        W2, high precision, or codes quantized along I (axis 1) with down_weight_scales [E, ceil(I/32), H].
    token_position_to_id : integer array [N * B]
        Token of each block position (-1, or T with skip_token=False, for padding); ignored (may be None) with
        config.single_expert_dense.
    block_to_expert : integer array [N, 1] (or [N])
        Expert of each block; ignored (may be None) with config.single_expert_dense.
    block_size : int B >= 1
        Positions per block, as given to `route`. The default 4096 is the NKI kernel's; small problems need their
        own value.
    config : MXFP8MOEBwdConfig or None (defaults)
    gate_up_weight_scales, down_weight_scales : uint8 / float8_e8m0fnu arrays or None
        Scales of pre-quantized weights (see above).
    num_valid_tokens : int array [1] or None
        With config.single_expert_dense: tokens at or past the count act as padding (their output rows are 0).
    gate_and_up_proj_bias : array [E, 2, I] or None, keyword-only
        b1 (with config.bias; None = zero).
    down_proj_bias : array [E, H] or None, keyword-only
        b2 (with config.bias; None = zero).
    checkpoints : "all", one name, or an iterable of names, keyword-only
        The checkpoints to return, from MOE_CHECKPOINTS (default: gate_up_proj_act_checkpoint_T only):
        gate_up_proj_act_checkpoint_T [N, 2, I, B] (clamped g at [n, 0, i, p], u at [n, 1, i, p]),
        gate_act_checkpoint_T [N, I, B] (act(g)), intermediate_checkpoint_T [N, I, B] (act(g) * u),
        scaled_intermediate_checkpoint_T [N, I, B] (a * act(g) * u) and down_proj_output_checkpoint [N, B, H]
        (inter @ W2 + b2, before the affinity; read by the AFFINITY_ON_H backward). Entries at padding positions
        are 0.
    output_dtype : dtype or None, keyword-only
        dtype of output: float32 / bfloat16 / float16; None = hidden_states' dtype (float32 for float64 input).
    checkpoint_dtype : float32 (default) | bfloat16 | float16, keyword-only
        dtype of the checkpoints (float32 checkpoints make the backward bitwise equal to recomputing them).
    stats : bool, keyword-only
        Also return the statistics of the GEMM operands (a separate pass; results are unchanged).

    Returns
    -------
    (output [T, H], {checkpoint name: array}); with stats=True also a list over experts of
    {operand name (MOE_OPERANDS): statistics dict (see mxfp8.quantize)}, summed over the expert's blocks (zero for
    operands the forward does not quantize).

    Raises
    ------
    ValueError (option values, unknown checkpoint names, ranks), TypeError (dtypes, config type), MXFP8Error (the
    library's checks: shapes, ids out of range, block_size, aliasing; the message says when block_size is the
    likely cause).
    """
    _declare()
    return _fwd_call("mxfp8_moe_forward", hidden_states, expert_affinities_masked, gate_up_proj_weight,
                     down_proj_weight, token_position_to_id, block_to_expert, block_size, config,
                     gate_up_weight_scales, down_weight_scales, num_valid_tokens, gate_and_up_proj_bias,
                     down_proj_bias, checkpoints, _out_dtype(hidden_states, output_dtype, "output_dtype"),
                     np.dtype(checkpoint_dtype), (), stats)


def blockwise_mm_fwd_golden(hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
                            token_position_to_id, block_to_expert, block_size=4096, config=None,
                            gate_up_weight_scales=None, down_weight_scales=None, num_valid_tokens=None, *,
                            gate_and_up_proj_bias=None, down_proj_bias=None, quantized=False,
                            checkpoints=()):
    """FP64 golden of blockwise_mm_fwd_mxfp8: a slow scalar reference for tests and second opinions. Returns
    (output [T, H] float64, {checkpoint name: float64 array}).

    hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight, token_position_to_id,
    block_to_expert, block_size, config, gate_up_weight_scales, down_weight_scales, num_valid_tokens,
    gate_and_up_proj_bias, down_proj_bias: as for blockwise_mm_fwd_mxfp8 (same shapes, dtypes and checks).

    quantized=False: the unquantized layer (pre-quantized weights enter as their exact dequantized values);
    quantized=True: every GEMM operand MX-quantized along that GEMM's contraction axis (1x32 groups, config's
    fp8_x4_dtype and scale_rule, values rounded to float32 first) and dequantized exactly, the GEMMs in FP64 -- the
    kernel without its FP32 rounding. checkpoints: as for blockwise_mm_fwd_mxfp8 (default none)."""
    _declare()
    return _fwd_call("mxfp8_moe_forward_golden", hidden_states, expert_affinities_masked, gate_up_proj_weight,
                     down_proj_weight, token_position_to_id, block_to_expert, block_size, config,
                     gate_up_weight_scales, down_weight_scales, num_valid_tokens, gate_and_up_proj_bias,
                     down_proj_bias, checkpoints, np.dtype(np.float64), np.dtype(np.float64),
                     (_lib.parse_bool(quantized, "quantized"),))


def _bwd_call(fn, extra, grad_dtype, hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
              token_position_to_id, block_to_expert, output_hidden_states_grad, block_size, cks, config,
              gate_up_weight_scales, down_weight_scales, num_valid_tokens, gate_and_up_proj_bias, down_proj_bias,
              given, stats=False):
    cfg, cc = _config(config)
    T, H, E, I, B, N = _dims(hidden_states, gate_up_proj_weight, token_position_to_id, block_size, cfg)
    a = _BwdArgs()
    _fill_common(a, cc, B, hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
                 token_position_to_id, block_to_expert, gate_and_up_proj_bias, down_proj_bias, gate_up_weight_scales,
                 down_weight_scales, num_valid_tokens)
    st = _stats_buffer(a, stats, E)
    _put(a, "output_hidden_states_grad", _lib.view(_arr(output_hidden_states_grad, "output_hidden_states_grad")))
    for name, v in cks.items():
        _put(a, name, _opt_view(v, name))
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
    _call(fn, a, g, extra, B, None if cfg.single_expert_dense else token_position_to_id, block_to_expert)
    if st is not None:
        return tuple(out) + (_stats_list(st, E),)
    return tuple(out)


def blockwise_mm_bwd_mxfp8(hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
                           token_position_to_id, block_to_expert, output_hidden_states_grad, block_size=4096,
                           gate_up_proj_act_checkpoint_T=None, gate_act_checkpoint_T=None,
                           intermediate_checkpoint_T=None, scaled_intermediate_checkpoint_T=None,
                           down_proj_act_checkpoint=None, config=None, gate_up_weight_scales=None,
                           down_weight_scales=None, num_valid_tokens=None, *, down_proj_output_checkpoint=None,
                           gate_and_up_proj_bias=None, down_proj_bias=None, grad_dtype=None,
                           hidden_states_grad=None, gate_up_proj_weight_grad=None, down_proj_weight_grad=None,
                           gate_and_up_proj_bias_grad=None, down_proj_bias_grad=None, stats=False):
    """MXFP8 backward of the blockwise MoE layer (NKI's blockwise_mm_bwd_mxfp8; see the module doc for the layer).

    Per block: Phase 1 dY_blk @ W2[e]^T (quantized along H) gives the intermediate's gradient and the affinity
    gradient; the activation's derivative (with strict clamp masks) gives dGU = [d_gate | d_up]; Phase 2
    dGU @ W1[e]^T (along 2I) adds into hidden_states_grad; Phases 3 and 4 (along the block's positions) add into
    the weight gradients. Gradients accumulate over blocks in FP32 and are rounded once.

    Parameters
    ----------
    hidden_states : array [T, H]
        X: float32 / bfloat16 / float16 (float64, numbers and lists are rounded to float32).
    expert_affinities_masked : array [T * E, 1] (or [T * E])
        a, as `route` returns it.
    gate_up_proj_weight : array [E, H, 2, I]
        W1 ([:, :, 0] gate, [:, :, 1] up), high precision, or FP8 codes quantized along 2I
        (``mxfp8.quantize(W1.reshape(E, H, 2 * I), fmt, axis=2)``, codes reshaped back) with gate_up_weight_scales
        [E, H, ceil(2I/32)].
    down_proj_weight : array [E, I, H]
        W2, high precision, or codes quantized along H (axis 2) with down_weight_scales [E, I, ceil(H/32)].
    token_position_to_id : integer array [N * B]
        Token of each block position (-1, or T with skip_token=False, for padding); ignored with
        config.single_expert_dense.
    block_to_expert : integer array [N, 1] (or [N])
        Expert of each block; ignored with config.single_expert_dense.
    output_hidden_states_grad : array [T, H]
        dY, the gradient of the layer's output.
    block_size : int B >= 1
        Positions per block, as given to `route`. The default 4096 is the NKI kernel's; small problems need their
        own value.
    gate_up_proj_act_checkpoint_T : array [N, 2, I, B] or None
        Clamped g, u from the forward; recomputed per block (the forward's MXFP8 GEMM) when None.
    gate_act_checkpoint_T, intermediate_checkpoint_T : arrays [N, I, B] or None
        act(g) and act(g) * u; recomputed when None.
    scaled_intermediate_checkpoint_T : array [N, I, B] or None
        a * act(g) * u (the AFFINITY_ON_I Phase 4 operand); recomputed when None.
    down_proj_act_checkpoint : array [N, B, H] or None
        a * dY (the AFFINITY_ON_H Phase 1 / 4 operand); recomputed when None.
    config : MXFP8MOEBwdConfig or None (defaults)
    gate_up_weight_scales, down_weight_scales : uint8 / float8_e8m0fnu arrays or None
        Scales of pre-quantized weights (see above).
    num_valid_tokens : int array [1] or None
        With config.single_expert_dense: tokens at or past the count act as padding; their hidden_states_grad rows
        and expert_affinities_masked_grad entries are 0.
    down_proj_output_checkpoint : array [N, B, H] or None, keyword-only
        inter @ W2 + b2 from the forward (AFFINITY_ON_H affinity gradient); recomputed when None.
    gate_and_up_proj_bias, down_proj_bias : arrays [E, 2, I], [E, H] or None, keyword-only
        b1, b2 of a layer with config.bias (None = zero).
    grad_dtype : dtype or None, keyword-only
        dtype of the returned gradients: float32 / bfloat16 / float16; None = hidden_states' dtype (float32 for
        float64 input).
    hidden_states_grad, gate_up_proj_weight_grad, down_proj_weight_grad, gate_and_up_proj_bias_grad,
    down_proj_bias_grad : writable arrays or None, keyword-only
        Output buffers of the gradients' shapes; with config.accumulate_hidden_states_grad /
        config.skip_grad_initialization the gradient is added to what they hold (one FP32 addition). They are
        written in place and returned.
    stats : bool, keyword-only
        Also return the statistics of every GEMM operand the backward quantizes (a separate pass; results are
        unchanged): a list over experts of {operand name (MOE_OPERANDS): statistics dict}, summed over the expert's
        blocks (weights counted once; the recomputation of the forward's GEMMs under their forward names).

    Returns
    -------
    (hidden_states_grad [T, H], expert_affinities_masked_grad [T * E, 1], gate_up_proj_weight_grad [E, H, 2, I],
    down_proj_weight_grad [E, I, H]), plus (gate_and_up_proj_bias_grad [E, 2, I], down_proj_bias_grad [E, H]) when
    config.bias, plus the statistics list with stats=True. expert_affinities_masked_grad is 0 for (token, expert)
    pairs no block routes; turn it into the gradient of topk_weights with mxfp8.topk_weights_grad.

    Raises
    ------
    ValueError (option values, buffers of the wrong shape or read-only), TypeError (dtypes, config type),
    MXFP8Error (the library's checks: shapes, ids out of range, block_size, clamp limits, aliasing; nothing is
    written on error; the message says when block_size is the likely cause).
    """
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
                     down_weight_scales, num_valid_tokens, gate_and_up_proj_bias, down_proj_bias, given, stats)


def blockwise_mm_bwd_golden(hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
                            token_position_to_id, block_to_expert, output_hidden_states_grad, block_size=4096,
                            config=None, gate_up_weight_scales=None, down_weight_scales=None, num_valid_tokens=None,
                            *, gate_and_up_proj_bias=None, down_proj_bias=None, quantized=False, **given):
    """FP64 golden of blockwise_mm_bwd_mxfp8: a slow scalar reference for tests and second opinions. Returns the
    same tuple as blockwise_mm_bwd_mxfp8, as float64 arrays.

    hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight, token_position_to_id,
    block_to_expert, output_hidden_states_grad, block_size, config, gate_up_weight_scales, down_weight_scales,
    num_valid_tokens, gate_and_up_proj_bias, down_proj_bias: as for blockwise_mm_bwd_mxfp8 (same shapes, dtypes and
    checks). Checkpoints are not taken: every intermediate is recomputed in FP64 from the inputs.

    quantized=False: the unquantized layer (the golden of the NKI pass criteria); quantized=True: each GEMM operand
    MX-quantized along its contraction axis as the kernel does (values rounded to float32 first), GEMMs in FP64.
    Output buffers (float64) may be given as keywords, as for blockwise_mm_bwd_mxfp8."""
    _declare()
    unknown = set(given) - set(_GRAD_NAMES)
    if unknown:
        raise TypeError(f"blockwise_mm_bwd_golden: unexpected keyword argument(s) {sorted(unknown)}")
    return _bwd_call("mxfp8_moe_backward_golden", (_lib.parse_bool(quantized, "quantized"),), np.dtype(np.float64),
                     hidden_states,
                     expert_affinities_masked, gate_up_proj_weight, down_proj_weight, token_position_to_id,
                     block_to_expert, output_hidden_states_grad, block_size, {}, config, gate_up_weight_scales,
                     down_weight_scales, num_valid_tokens, gate_and_up_proj_bias, down_proj_bias, given)
