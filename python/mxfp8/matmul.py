"""matmul_mxfp8: forward and backward of an MXFP8 linear layer Y = X @ W^T, with the parameters of the NKI API
reference nkilib.experimental.matmul_mxfp8 (matmul_mxfp8_backward), plus golden references and the NKI pass
criteria.

    input_grad, weight_grad = mxfp8.matmul_mxfp8_backward(output_grad, weights, input_activation, ...)
        dX [M, K] = dY [M, N] @ W [N, K]      (dY and W MX-quantized along N)
        dW [N, K] = dY^T @ X [M, K]           (dY and X MX-quantized along M)
    y = mxfp8.matmul_mxfp8(input_activation, weights, ...)     Y [M, N] = X @ W^T (both quantized along K)

Arithmetic: each operand is quantized along its own contraction axis from high precision (dY twice), dequantized
exactly, and every output element is an FP32 fused-multiply-add chain over the contraction index in ascending order,
rounded once (to nearest even) to output_dtype. Results are bitwise independent of tile_loop_order, run_with_lnc2,
lnc_2_shard_rhs, spill_reload, the tile/block sizes of the configs, the thread count and the ISA.

High-precision operands: float32, ml_dtypes.bfloat16 or float16 (the NKI kernel takes bfloat16); float64 arrays,
Python numbers and lists are rounded once to float32 (to nearest even), so results equal those of the float32 values.

Pre-quantized operands: pass FP8 codes (ml_dtypes float8 arrays of float8_dtype, or uint8 codes, or uint32
x4-packed codes: byte c of word p = element 4p+c along the contraction axis) together with their E8M0 scales
(uint8): output_grad [M, N] quantized along N with output_grad_scales for F = M rows; weights [N, K] quantized along N
with weight_scales for F = K rows; input_activation [M, K] quantized along M with input_scales for F = K rows.
Scale layout: use_scale_packing=True -> NKI packed; else `scale_layout` ("compact" [F, G], "nki_unpacked",
"swizzle_128x4"; see mxfp8.scale_layout_shape). `*_is_swizzled`: the tensor is in NKI's swizzled [C/4, 4F]
arrangement of its [C, F] form (C = contraction axis: N for output_grad and weights, M for input_activation;
C % 128 == 0; see mxfp8.swizzle_nki).

Differences from the NKI kernel: any M, N, K >= 0 (no multiple-of-128/512 limits; 0 gives empty or zero outputs);
quant_scheme (keyword-only) defaults to "1x32" (NKI's "wrapx" groups are available where the contraction lengths
are multiples of 128); scale_rule (keyword-only) picks the E8M0 rule ("nki" default, "ocp", "rceil");
scale_layout (keyword-only) says how unpacked pre-quantized scales are laid out.
"""

import ctypes
from dataclasses import dataclass
from typing import Optional

import numpy as np

from . import _lib

__all__ = ["MatmulMxfp8KernelConfig", "matmul_mxfp8", "matmul_mxfp8_backward", "bias_grad", "matmul_golden_unquantized",
           "matmul_golden_quantized", "matmul_mxfp8_backward_golden", "compare_nki", "BWD_QUANTIZATIONS"]

LOOP_ORDERS = _lib.LOOP_ORDERS


class _Operand(ctypes.Structure):
    _c_name = "mxfp8_operand"
    _fields_ = [("values", _lib.Tensor), ("scales", _lib.Tensor), ("scale_layout", ctypes.c_int),
                ("swizzled", ctypes.c_int), ("rounding", ctypes.c_int), ("seed", ctypes.c_uint64),
                ("stream", ctypes.c_uint64), ("stats", ctypes.c_void_p)]


class _Config(ctypes.Structure):
    """Mirror of struct mxfp8_matmul_config."""
    _c_name = "mxfp8_matmul_config"
    _fields_ = [(n, ctypes.c_int64) for n in ("M", "K", "N", "tile_m", "tile_k", "tile_n", "tiles_in_block_m",
                                               "tiles_in_block_n", "tiles_in_block_k", "tiles_in_load_m",
                                               "tiles_in_load_n")] + \
               [(n, ctypes.c_int) for n in ("block_loop_order", "tile_loop_order", "float8_dtype",
                                             "enable_scale_packing", "run_with_lnc2", "lnc_2_shard_rhs",
                                             "spill_reload", "quant_scheme", "scale_rule")] + \
               [("workspace", ctypes.c_void_p)]


class _BwdArgs(ctypes.Structure):
    """Mirror of struct mxfp8_matmul_bwd_args."""
    _c_name = "mxfp8_matmul_bwd_args"
    _fields_ = [("output_grad", _lib.Tensor), ("weights", _lib.Tensor), ("input_activation", _lib.Tensor),
                ("input_grad_config", ctypes.POINTER(_Config)), ("weight_grad_config", ctypes.POINTER(_Config)),
                ("tile_loop_order", ctypes.c_int), ("float8_dtype", ctypes.c_int), ("output_dtype", ctypes.c_int),
                ("run_with_lnc2", ctypes.c_int), ("lnc_2_shard_rhs", ctypes.c_int),
                ("output_grad_scales", _lib.Tensor), ("weight_scales", _lib.Tensor), ("input_scales", _lib.Tensor),
                ("use_scale_packing", ctypes.c_int), ("scale_layout", ctypes.c_int), ("spill_reload", ctypes.c_int),
                ("output_grad_is_swizzled", ctypes.c_int), ("weights_is_swizzled", ctypes.c_int),
                ("input_is_swizzled", ctypes.c_int), ("scale_rule", ctypes.c_int), ("quant_scheme", ctypes.c_int),
                ("workspace", ctypes.c_void_p), ("output_grad_rounding", ctypes.c_int),
                ("weights_rounding", ctypes.c_int), ("input_rounding", ctypes.c_int),
                ("rounding_seed", ctypes.c_uint64), ("stats", ctypes.c_void_p)]

# The four quantizations of matmul_mxfp8_backward, in the order of its statistics (and stochastic-rounding streams).
BWD_QUANTIZATIONS = ("output_grad_along_n", "weights_along_n", "output_grad_along_m", "input_activation_along_m")


class _CompareResult(ctypes.Structure):
    _c_name = "mxfp8_compare_result"
    _fields_ = [("max_abs_golden", ctypes.c_double), ("max_abs_err", ctypes.c_double),
                ("max_rel_err", ctypes.c_double), ("cosine", ctypes.c_double), ("norm_euclid", ctypes.c_double),
                ("allclose", ctypes.c_int), ("num_nan", ctypes.c_int64)]


def _loop_order(value, param):
    if isinstance(value, str) and value.strip().lower() in LOOP_ORDERS:
        return LOOP_ORDERS[value.strip().lower()]
    raise ValueError(f"{param}: unknown loop order {value!r} (expected one of {', '.join(LOOP_ORDERS)})")


def _float8(value, param="float8_dtype"):
    return _lib.parse_format(value, param, _lib.FLOAT8_DTYPES)


@dataclass
class MatmulMxfp8KernelConfig:
    """MatmulMxfp8KernelConfig of the NKI API: the blocking of one GEMM phase (the dX or the dW phase of the
    backward, or the forward). Every field is speed-only except float8_dtype and quant_scheme; results are bitwise
    the same for any value.

    M, K, N : int >= 0 (0 = from the tensors)
        The phase's logical sizes: dX phase (M, N, K) -- rows M, contraction N, columns K; dW phase (N, M, K). When
        set they must match the tensors (MXFP8Error otherwise).
    tile_m, tile_k, tile_n : int >= 0 or None (auto)
        On a CPU tiles are cache blocking: tile_m / tile_n are rounded up to the microkernel's 8 x 32 register tile,
        tile_k is the depth of one microkernel pass.
    TILES_IN_BLOCK_M, TILES_IN_BLOCK_N : int >= 0 or None (auto)
        tile_m * TILES_IN_BLOCK_M x tile_n * TILES_IN_BLOCK_N is the output block one thread owns.
    TILES_IN_BLOCK_K, TILES_IN_LOAD_M, TILES_IN_LOAD_N : int >= 0 or None
        Trainium-only (SBUF loads); validated, no effect (blocks always span all of K).
    block_loop_order, tile_loop_order : "mnk" | "mkn" | "nmk" | "nkm" | "kmn" | "knm"
        Order of a thread's blocks and of the tiles inside a block.
    float8_dtype : "float8_e4m3fn" | "float8_e5m2" | None
        When given it must agree with the call's float8_dtype (the call's value governs; ValueError otherwise).
    enable_scale_packing : bool
        Asserts that pre-quantized operands' scales are in NKI's packed layout.
    run_with_lnc2 : bool
        Let threads split the work (False: one thread).
    lnc_2_shard_rhs : bool or None
        Threads split along N (True) or M (False); None = along N when N >= M.
    spill_reload : bool
        Quantize the left operand once into a shared workspace instead of once per thread that needs it.
    quant_scheme : "1x32" | "wrapx" | None
        When given it must agree with the call's quant_scheme (ValueError otherwise).
    output_dtype : "bfloat16" | "float32" | "float16" | None
        When given it must agree with the call's output_dtype (ValueError otherwise).
    Flags take a bool or 0/1; anything else raises TypeError / ValueError naming the field."""
    M: int = 0
    K: int = 0
    N: int = 0
    tile_m: Optional[int] = None
    tile_k: Optional[int] = None
    tile_n: Optional[int] = None
    TILES_IN_BLOCK_M: Optional[int] = None
    TILES_IN_BLOCK_N: Optional[int] = None
    TILES_IN_BLOCK_K: Optional[int] = None
    TILES_IN_LOAD_M: Optional[int] = None
    TILES_IN_LOAD_N: Optional[int] = None
    block_loop_order: str = "mnk"
    tile_loop_order: str = "mnk"
    float8_dtype: Optional[str] = None
    enable_scale_packing: bool = False
    run_with_lnc2: bool = True
    lnc_2_shard_rhs: Optional[bool] = None
    spill_reload: bool = False
    quant_scheme: Optional[str] = None
    output_dtype: Optional[str] = None

    def _to_c(self, fmt, rule, group, out_code, param):
        c = _Config()
        _lib.function("mxfp8_matmul_config_init")(ctypes.byref(c))
        for name, attr in (("M", "M"), ("K", "K"), ("N", "N"), ("tile_m", "tile_m"), ("tile_k", "tile_k"),
                           ("tile_n", "tile_n"), ("tiles_in_block_m", "TILES_IN_BLOCK_M"),
                           ("tiles_in_block_n", "TILES_IN_BLOCK_N"), ("tiles_in_block_k", "TILES_IN_BLOCK_K"),
                           ("tiles_in_load_m", "TILES_IN_LOAD_M"), ("tiles_in_load_n", "TILES_IN_LOAD_N")):
            v = getattr(self, attr)
            if v is None:
                v = 0
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"{param}.{attr}: expected a non-negative int or None, got {v!r}")
            setattr(c, name, int(v))
        c.block_loop_order = _loop_order(self.block_loop_order, f"{param}.block_loop_order")
        c.tile_loop_order = _loop_order(self.tile_loop_order, f"{param}.tile_loop_order")
        if self.float8_dtype is not None and _float8(self.float8_dtype, f"{param}.float8_dtype") != fmt:
            raise ValueError(f"{param}.float8_dtype {self.float8_dtype!r} disagrees with float8_dtype of the call")
        if self.quant_scheme is not None and _lib.parse(_lib.GROUPS, self.quant_scheme,
                                                        f"{param}.quant_scheme") != group:
            raise ValueError(f"{param}.quant_scheme {self.quant_scheme!r} disagrees with quant_scheme of the call")
        if self.output_dtype is not None and _lib.parse_out_dtype(self.output_dtype,
                                                                  f"{param}.output_dtype") != out_code:
            raise ValueError(f"{param}.output_dtype {self.output_dtype!r} disagrees with output_dtype of the call")
        c.float8_dtype = fmt
        c.scale_rule = rule
        c.quant_scheme = group
        c.enable_scale_packing = _lib.parse_bool(self.enable_scale_packing, f"{param}.enable_scale_packing")
        c.run_with_lnc2 = _lib.parse_bool(self.run_with_lnc2, f"{param}.run_with_lnc2")
        c.lnc_2_shard_rhs = -1 if self.lnc_2_shard_rhs is None else _lib.parse_bool(self.lnc_2_shard_rhs,
                                                                                     f"{param}.lnc_2_shard_rhs")
        c.spill_reload = _lib.parse_bool(self.spill_reload, f"{param}.spill_reload")
        return c


def _values(x, name, fmt):
    """View of an operand's values: high precision (f32/bf16/f16), FP8 codes (float8 of fmt or uint8) or uint32 x4."""
    ok = (_lib.F32, _lib.BF16, _lib.F16, _lib.E4M3, _lib.E5M2, _lib.U8, _lib.U32)
    arr = _lib.as_array(x, ok, name)
    if arr.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D array, got shape {arr.shape}")
    return arr


def _scales(s, name):
    if s is None:
        return None
    arr = _lib.as_array(s, name=name)
    code = _lib.U8 if arr.dtype == np.uint8 else None
    return _lib.view(arr, code)


def _is_codes(arr):
    return _lib.dtype_code(arr.dtype) in (_lib.E4M3, _lib.E5M2, _lib.U8, _lib.U32)


def _cf_dims(arr, swizzled):
    """(C, F) of a [C, F]-form operand (contraction first) as given: plain, swizzled, x4 (C rounded up to 4)."""
    x4 = arr.dtype == np.uint32
    if swizzled:
        return arr.shape[0] * 4, (arr.shape[1] if x4 else arr.shape[1] // 4)
    return (arr.shape[0] * 4 if x4 else arr.shape[0]), arr.shape[1]


def _bwd_dims(dy, w, shape, dy_swizzled, w_swizzled):
    """(M, N, K) of the backward from dY and W as given (or from `shape`)."""
    if shape is not None:
        return tuple(int(v) for v in shape)
    # dY as the [N, M] contraction-first form when swizzled, else [M, N] (x4 along N)
    if dy_swizzled:
        N, M = _cf_dims(dy, True)
    else:
        M = dy.shape[0]
        N = dy.shape[1] * 4 if dy.dtype == np.uint32 else dy.shape[1]
    Nw, K = _cf_dims(w, w_swizzled)
    if dy.dtype == np.uint32 and not dy_swizzled and not (w.dtype == np.uint32 and not w_swizzled):
        N = Nw
    return M, N, K


def matmul_mxfp8_backward(output_grad, weights, input_activation, input_grad_config=None, weight_grad_config=None,
                          tile_loop_order="mnk", float8_dtype="float8_e5m2", output_dtype="bfloat16",
                          run_with_lnc2=True, lnc_2_shard_rhs=True, output_grad_scales=None, weight_scales=None,
                          input_scales=None, use_scale_packing=False, spill_reload=False,
                          output_grad_is_swizzled=False, weights_is_swizzled=False, input_is_swizzled=False, *,
                          scale_rule="nki", quant_scheme="1x32", scale_layout="compact", shape=None,
                          output_grad_rounding="nearest", weights_rounding="nearest", input_rounding="nearest",
                          rounding_seed=0, stats=False):
    """Backward of the linear layer Y = X @ W^T with MXFP8 GEMMs (NKI's matmul_mxfp8_backward).

    dX = dY @ W (dY and W quantized along N) and dW = dY^T @ X (dY and X quantized along M); see the module doc for
    the arithmetic and for pre-quantized operands.

    Parameters
    ----------
    output_grad : array [M, N]
        dY: float32 / bfloat16 / float16 (float64, numbers and lists are rounded to float32), or FP8 codes quantized
        along N with output_grad_scales [M, ceil(N/32)] (compact); swizzled: [N/4, 4M].
    weights : array [N, K]
        W: high precision, or codes quantized along N with weight_scales for F = K rows (compact [K, ceil(N/32)]);
        swizzled: [N/4, 4K].
    input_activation : array [M, K]
        X: high precision, or codes quantized along M with input_scales for F = K rows (compact [K, ceil(M/32)]);
        swizzled: [M/4, 4K].
    input_grad_config, weight_grad_config : MatmulMxfp8KernelConfig or None
        Blocking of the dX and the dW phase (None = automatic).
    tile_loop_order : "mnk" (default) | "mkn" | "nmk" | "nkm" | "kmn" | "knm"
        Tile order inside a block (speed only).
    float8_dtype : "float8_e5m2" (default) | "float8_e4m3fn"
        Element format of every quantized operand (exact spelling; anything else raises ValueError).
    output_dtype : "bfloat16" (default) | "float32" | "float16", or the numpy / ml_dtypes dtype
        dtype of both gradients.
    run_with_lnc2, lnc_2_shard_rhs, spill_reload : bool
        Thread split and workspace reuse (speed only; see MatmulMxfp8KernelConfig).
    output_grad_scales, weight_scales, input_scales : uint8 / float8_e8m0fnu arrays or None
        E8M0 scales of pre-quantized operands (None: that operand is high precision and quantized here).
    use_scale_packing : bool
        The given scales are in NKI's packed layout (else in `scale_layout`).
    output_grad_is_swizzled, weights_is_swizzled, input_is_swizzled : bool
        The operand is in NKI's swizzled arrangement (mxfp8.swizzle_nki of its [C, F] form).
    scale_rule : "nki" (default) | "ocp" | "rceil", keyword-only
        E8M0 rule of the on-the-fly quantization.
    quant_scheme : "1x32" (default) | "wrapx", keyword-only
        Group scheme ("wrapx" needs M % 128 == 0 and N % 128 == 0).
    scale_layout : "compact" (default) | "nki_unpacked" | "swizzle_128x4", keyword-only
        Layout of pre-quantized scales when use_scale_packing is False.
    shape : (M, N, K) or None, keyword-only
        Needed only when both dY and W are x4-packed plain arrays whose N is not a multiple of 4.
    output_grad_rounding, weights_rounding, input_rounding : "nearest" (default) | "stochastic", keyword-only
        Element rounding of dY (both of its quantizations), W and X when the call quantizes them (stochastic
        rounding as in mxfp8.quantize, keyed by rounding_seed; quantization q of BWD_QUANTIZATIONS uses stream q
        and the element's row-major index in its own tensor). Pre-quantized operands are used as given.
    rounding_seed : int in [0, 2**64), keyword-only
    stats : bool, keyword-only
        Also return the statistics of the four quantizations (a separate pass; results are unchanged).

    Returns
    -------
    (input_grad [M, K], weight_grad [N, K]), arrays of output_dtype (ml_dtypes.bfloat16 by default); with
    stats=True also a dict {name: statistics dict (see mxfp8.quantize)} over BWD_QUANTIZATIONS (all zero for an
    operand given pre-quantized).

    Raises
    ------
    ValueError (option values), TypeError (dtypes, config types, flags that are not bools), MXFP8Error (the
    library's checks: shapes, scales, wrapx / swizzle lengths, aliasing).
    """
    fmt = _float8(float8_dtype)
    out_code = _lib.parse_out_dtype(output_dtype, "output_dtype")
    rule = _lib.parse(_lib.SCALE_RULES, scale_rule, "scale_rule")
    group = _lib.parse(_lib.GROUPS, quant_scheme, "quant_scheme")
    lay = _lib.parse(_lib.LAYOUTS, scale_layout, "scale_layout")
    tlo = _loop_order(tile_loop_order, "tile_loop_order")
    dy = _values(output_grad, "output_grad", fmt)
    w = _values(weights, "weights", fmt)
    x = _values(input_activation, "input_activation", fmt)
    M, N, K = _bwd_dims(dy, w, shape, output_grad_is_swizzled, weights_is_swizzled)
    ig = _lib.empty((M, K), out_code)
    wg = _lib.empty((N, K), out_code)
    a = _BwdArgs()
    _lib.function("mxfp8_matmul_bwd_args_init")(ctypes.byref(a))
    a.workspace = _lib.workspace()
    a.output_grad = _lib.view(dy)
    a.weights = _lib.view(w)
    a.input_activation = _lib.view(x)
    keep = []
    if input_grad_config is not None:
        if not isinstance(input_grad_config, MatmulMxfp8KernelConfig):
            raise TypeError("input_grad_config: expected a MatmulMxfp8KernelConfig")
        cx = input_grad_config._to_c(fmt, rule, group, out_code, "input_grad_config")
        keep.append(cx)
        a.input_grad_config = ctypes.pointer(cx)
    if weight_grad_config is not None:
        if not isinstance(weight_grad_config, MatmulMxfp8KernelConfig):
            raise TypeError("weight_grad_config: expected a MatmulMxfp8KernelConfig")
        cw = weight_grad_config._to_c(fmt, rule, group, out_code, "weight_grad_config")
        keep.append(cw)
        a.weight_grad_config = ctypes.pointer(cw)
    a.tile_loop_order = tlo
    a.float8_dtype = fmt
    a.output_dtype = out_code
    a.run_with_lnc2 = _lib.parse_bool(run_with_lnc2, "run_with_lnc2")
    a.lnc_2_shard_rhs = _lib.parse_bool(lnc_2_shard_rhs, "lnc_2_shard_rhs")
    for field, s, nm in (("output_grad_scales", output_grad_scales, "output_grad_scales"),
                         ("weight_scales", weight_scales, "weight_scales"),
                         ("input_scales", input_scales, "input_scales")):
        v = _scales(s, nm)
        if v is not None:
            setattr(a, field, v)
            keep.append(v)
    a.use_scale_packing = _lib.parse_bool(use_scale_packing, "use_scale_packing")
    a.scale_layout = lay
    a.spill_reload = _lib.parse_bool(spill_reload, "spill_reload")
    a.output_grad_is_swizzled = _lib.parse_bool(output_grad_is_swizzled, "output_grad_is_swizzled")
    a.weights_is_swizzled = _lib.parse_bool(weights_is_swizzled, "weights_is_swizzled")
    a.input_is_swizzled = _lib.parse_bool(input_is_swizzled, "input_is_swizzled")
    a.scale_rule = rule
    a.quant_scheme = group
    a.output_grad_rounding = _lib.parse(_lib.ROUNDINGS, output_grad_rounding, "output_grad_rounding")
    a.weights_rounding = _lib.parse(_lib.ROUNDINGS, weights_rounding, "weights_rounding")
    a.input_rounding = _lib.parse(_lib.ROUNDINGS, input_rounding, "input_rounding")
    a.rounding_seed = _lib.parse_seed(rounding_seed, "rounding_seed")
    st = (_lib.QuantStats * 4)() if _lib.parse_bool(stats, "stats") else None
    a.stats = ctypes.addressof(st) if st is not None else None
    vig, vwg = _lib.view(ig), _lib.view(wg)
    keep += [dy, w, x]
    _lib.call("mxfp8_matmul_backward", ctypes.byref(a), ctypes.byref(vig), ctypes.byref(vwg))
    if st is not None:
        return ig, wg, {n: _lib.stats_dict(st[i]) for i, n in enumerate(BWD_QUANTIZATIONS)}
    return ig, wg


def matmul_mxfp8(input_activation, weights, config=None, float8_dtype="float8_e5m2", output_dtype="bfloat16",
                 input_scales=None, weight_scales=None, use_scale_packing=False, input_is_swizzled=False,
                 weights_is_swizzled=False, *, scale_rule="nki", quant_scheme="1x32", scale_layout="compact",
                 tile_loop_order=None, K=None, input_rounding="nearest", weights_rounding="nearest", rounding_seed=0,
                 stats=False, bias=None):
    """Forward of the linear layer with MXFP8 GEMM: Y [M, N] = X [M, K] @ W [N, K]^T (+ bias), both quantized along K.

    Parameters
    ----------
    input_activation : array [M, K]
        X: float32 / bfloat16 / float16 (float64, numbers and lists are rounded to float32), or codes [M, K] (or
        uint32 x4 [M, ceil(K/4)]) with input_scales for F = M rows; swizzled: [K/4, 4M].
    weights : array [N, K]
        W: high precision, or codes [N, K] (x4 [N, ceil(K/4)]) with weight_scales for F = N rows; swizzled [K/4, 4N].
    config : MatmulMxfp8KernelConfig or None
        Blocking (speed only); its M, K, N, when set, must match.
    float8_dtype : "float8_e5m2" (default) | "float8_e4m3fn"
    output_dtype : "bfloat16" (default) | "float32" | "float16"
    input_scales, weight_scales : uint8 / float8_e8m0fnu arrays or None
        E8M0 scales of pre-quantized operands: NKI packed layout when use_scale_packing, else `scale_layout`.
    use_scale_packing, input_is_swizzled, weights_is_swizzled : bool
    scale_rule, quant_scheme, scale_layout : keyword-only, as for matmul_mxfp8_backward
    tile_loop_order : loop order or None, keyword-only (overrides the config's; speed only)
    K : int or None, keyword-only
        The contraction length when both operands are x4-packed and K is not a multiple of 4.
    input_rounding, weights_rounding : "nearest" (default) | "stochastic", keyword-only
        Element rounding of X and W when quantized here (stochastic: keyed by rounding_seed, stream 0 for X and 1
        for W, index r*K + k of the [M, K] / [N, K] operand).
    rounding_seed : int in [0, 2**64), keyword-only
    stats : bool, keyword-only
        Also return the statistics of both quantizations.
    bias : array [N] or None, keyword-only
        float32 / bfloat16 / float16 (float64, numbers and lists are rounded to float32). Not a parameter of the NKI
        page (the library's mxfp8_linear): each element is the sum without a bias as float32, plus bias[n] in one
        float32 addition, then rounded once to output_dtype -- torch's ``(y32 + b.float()).to(dtype)``.

    Returns
    -------
    Y [M, N] of output_dtype; with stats=True (Y, {"input_activation": dict, "weights": dict}) (see
    mxfp8.quantize). Raises ValueError, TypeError, MXFP8Error as matmul_mxfp8_backward.
    """
    fmt = _float8(float8_dtype)
    out_code = _lib.parse_out_dtype(output_dtype, "output_dtype")
    rule = _lib.parse(_lib.SCALE_RULES, scale_rule, "scale_rule")
    group = _lib.parse(_lib.GROUPS, quant_scheme, "quant_scheme")
    lay = 2 if use_scale_packing else _lib.parse(_lib.LAYOUTS, scale_layout, "scale_layout")
    if config is None:
        config = MatmulMxfp8KernelConfig()
    if not isinstance(config, MatmulMxfp8KernelConfig):
        raise TypeError("config: expected a MatmulMxfp8KernelConfig")
    c = config._to_c(fmt, rule, group, out_code, "config")
    if use_scale_packing:
        c.enable_scale_packing = 1
    if tile_loop_order is not None:
        c.tile_loop_order = _loop_order(tile_loop_order, "tile_loop_order")
    if K is not None:
        c.K = int(K)
    x = _values(input_activation, "input_activation", fmt)
    w = _values(weights, "weights", fmt)
    M = x.shape[1] // (1 if x.dtype == np.uint32 else 4) if input_is_swizzled else x.shape[0]
    N = w.shape[1] // (1 if w.dtype == np.uint32 else 4) if weights_is_swizzled else w.shape[0]
    y = _lib.empty((M, N), out_code)
    seed = _lib.parse_seed(rounding_seed, "rounding_seed")
    want = _lib.parse_bool(stats, "stats")
    st = (_lib.QuantStats * 2)()
    ops = []
    for i, (arr, s, swz, nm, rnd) in enumerate(((x, input_scales, input_is_swizzled, "input_scales",
                                                 _lib.parse(_lib.ROUNDINGS, input_rounding, "input_rounding")),
                                                (w, weight_scales, weights_is_swizzled, "weight_scales",
                                                 _lib.parse(_lib.ROUNDINGS, weights_rounding, "weights_rounding")))):
        o = _Operand()
        o.values = _lib.view(arr)
        v = _scales(s, nm)
        if v is not None:
            o.scales = v
        o.scale_layout = lay
        o.swizzled = int(bool(swz))
        o.rounding, o.seed, o.stream = rnd, seed, i
        o.stats = ctypes.addressof(st[i]) if want else None
        ops.append((o, v, arr))
    vy = _lib.view(y)
    c.workspace = _lib.workspace()
    if bias is None:
        _lib.call("mxfp8_matmul", ctypes.byref(ops[0][0]), ctypes.byref(ops[1][0]), ctypes.byref(c),
                  ctypes.byref(vy))
    else:
        b = _lib.as_array(bias, (_lib.F32, _lib.BF16, _lib.F16), "bias")
        if b.ndim != 1:
            raise ValueError(f"bias: expected a 1-D array [N], got shape {b.shape}")
        vb = _lib.view(b, name="bias")
        _lib.call("mxfp8_linear", ctypes.byref(ops[0][0]), ctypes.byref(ops[1][0]), ctypes.byref(vb),
                  ctypes.byref(c), ctypes.byref(vy))
    if want:
        return y, {"input_activation": _lib.stats_dict(st[0]), "weights": _lib.stats_dict(st[1])}
    return y


def matmul_golden_unquantized(a, b, round_to_bf16=True):
    """Unquantized golden GEMM, as the NKI kernel's own test computes it: C [M, N] = A [M, K] @ B [N, K]^T in
    float32 (a fused-multiply-add chain over k ascending) from the operands rounded to bfloat16 first
    (round_to_bf16=True) or as given.

    a, b: 2-D float32 / bfloat16 / float16 / float64 arrays (contraction axis last on both). Returns float32 C.
    Slow (scalar); for tests and second opinions."""
    A = _lib.as_array(a, (_lib.F32, _lib.BF16, _lib.F16, _lib.F64), "a")
    B = _lib.as_array(b, (_lib.F32, _lib.BF16, _lib.F16, _lib.F64), "b")
    if A.ndim != 2 or B.ndim != 2:
        raise ValueError("a, b: expected 2-D arrays")
    c = np.empty((A.shape[0], B.shape[0]), np.float32)
    va, vb, vc = _lib.view(A), _lib.view(B), _lib.view(c)
    _lib.call("mxfp8_gemm_golden_unquantized", ctypes.byref(va), ctypes.byref(vb),
              _lib.parse_bool(round_to_bf16, "round_to_bf16"),
              ctypes.byref(vc))
    return c


def matmul_golden_quantized(a, b, float8_dtype="float8_e5m2", scale_rule="nki", quant_scheme="1x32"):
    """Quantized golden GEMM: C [M, N] (float64) = deq(Q(A)) @ deq(Q(B))^T, both operands MX-quantized along K
    (their last axis) with float8_dtype, scale_rule and quant_scheme by the reference quantizer, dequantized
    exactly, accumulated in float64 -- the kernel's result without its float32 rounding.

    a [M, K], b [N, K]: float32 / bfloat16 / float16 / float64 (float64 values are rounded to float32 first, the
    quantizer's input type). Slow (scalar)."""
    A = _lib.as_array(a, (_lib.F32, _lib.BF16, _lib.F16, _lib.F64), "a")
    B = _lib.as_array(b, (_lib.F32, _lib.BF16, _lib.F16, _lib.F64), "b")
    if A.ndim != 2 or B.ndim != 2:
        raise ValueError("a, b: expected 2-D arrays")
    p = _lib.QuantParams(_float8(float8_dtype), _lib.parse(_lib.SCALE_RULES, scale_rule, "scale_rule"),
                         _lib.parse(_lib.GROUPS, quant_scheme, "quant_scheme"))
    c = np.empty((A.shape[0], B.shape[0]), np.float64)
    va, vb, vc = _lib.view(A), _lib.view(B), _lib.view(c)
    _lib.call("mxfp8_gemm_golden_quantized", ctypes.byref(va), ctypes.byref(vb), ctypes.byref(p), ctypes.byref(vc))
    return c


def bias_grad(output_grad, output_dtype="float32"):
    """Bias gradient of a linear layer Y = X @ W^T + b: ``output_grad.sum(0)`` accumulated in FP32 in one fixed
    order (rows in chunks of 32 summed in turn, the chunk sums combined pairwise) and rounded once to
    `output_dtype`; the same bits for any thread count.

    output_grad: dY [M, N] (array-like; float32, bfloat16 or float16; float64 is rounded to float32 first).
    output_dtype: "float32" (default), "bfloat16" or "float16", or a numpy dtype. Returns an [N] array.
    Raises MXFP8Error (shape, dtype) as the C library's mxfp8_bias_grad.
    """
    dy = _lib.as_array(output_grad, (_lib.F32, _lib.BF16, _lib.F16), "output_grad")
    if dy.ndim != 2:
        raise ValueError(f"output_grad: expected a 2-D [M, N] array, got shape {dy.shape}")
    out = _lib.empty((dy.shape[1],), _lib.parse_out_dtype(output_dtype, "output_dtype"))
    _lib.call("mxfp8_bias_grad", ctypes.byref(_lib.view(dy, name="output_grad")),
              ctypes.byref(_lib.view(out, name="bias_grad")))
    return out


def matmul_mxfp8_backward_golden(output_grad, weights, input_activation, quantized=False,
                                 float8_dtype="float8_e5m2", scale_rule="nki", quant_scheme="1x32"):
    """Golden (input_grad [M, K], weight_grad [N, K]) of matmul_mxfp8_backward for high-precision output_grad
    dY [M, N], weights W [N, K] and input_activation X [M, K] (float32 / bfloat16 / float16 / float64):
    quantized=False gives the unquantized golden (bfloat16-rounded inputs, float32
    accumulation, float32 results: the NKI test's reference); quantized=True quantizes each operand along its
    contraction axis as the kernel does (float8_dtype, scale_rule, quant_scheme as for matmul_mxfp8_backward) and
    accumulates in float64 (float64 results)."""
    dy = np.asarray(output_grad)
    w = np.asarray(weights)
    x = np.asarray(input_activation)
    if quantized:
        return (matmul_golden_quantized(dy, w.T, float8_dtype, scale_rule, quant_scheme),
                matmul_golden_quantized(dy.T, x.T, float8_dtype, scale_rule, quant_scheme))
    return matmul_golden_unquantized(dy, w.T), matmul_golden_unquantized(dy.T, x.T)


def compare_nki(kernel, golden, atol_frac=0.2, rtol=1e-3):
    """The NKI pass criteria of a kernel output against a golden of the same number of elements (float32 /
    bfloat16 / float16 / float64 arrays). Returns a dict: max_abs_golden (max |g|), max_abs_err (max |k - g|),
    max_rel_err (max |k - g| / max |g|), cosine (<k, g> / (|k| |g|)), norm_euclid (|k - g| / (|k| + |g|)),
    allclose (|k - g| <= atol_frac * max |g| + rtol * |g| everywhere), num_nan (NaNs in k) and passed (allclose,
    cosine >= 0.995, norm_euclid <= 0.10 and no NaN: the thresholds of the NKI matmul test). These criteria are
    loose by design (a gradient uniformly 1.2x too large passes them); use them beside an exact check."""
    k = _lib.as_array(kernel, (_lib.F32, _lib.BF16, _lib.F16, _lib.F64), "kernel")
    g = _lib.as_array(golden, (_lib.F32, _lib.BF16, _lib.F16, _lib.F64), "golden")
    r = _CompareResult()
    vk, vg = _lib.view(k), _lib.view(g)
    _lib.call("mxfp8_compare", ctypes.byref(vk), ctypes.byref(vg), float(atol_frac), float(rtol), ctypes.byref(r))
    d = {f: getattr(r, f) for f, _ in _CompareResult._fields_}
    d["allclose"] = bool(d["allclose"])
    d["passed"] = d["allclose"] and d["cosine"] >= 0.995 and d["norm_euclid"] <= 0.10 and d["num_nan"] == 0
    return d
