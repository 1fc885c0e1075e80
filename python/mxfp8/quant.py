"""MX quantization, dequantization, scale layouts and element packing (the numpy / ml_dtypes front end of libmxfp8).

The rule (OCP Microscaling Formats v1.0, section 6.3, and NKI's nki.isa.quantize_mx): groups of 32 consecutive values
along `axis` share one E8M0 scale 2^e; each element is RNE(x * 2^-e) in FP8 (E4M3 or E5M2), saturating to +-max
normal. Scale rules: "nki" (default, e = floor(log2 amax) - (emax - 1), NKI's choice: one spare binade), "ocp"
(e = floor(log2 amax) - emax, the OCP specification's) and "rceil" (e = ceil(log2(amax / max_normal)), the smallest
scale that needs no saturation). An all-zero group gets scale code 0; a group holding any NaN or Inf gets scale code
255 (the E8M0 NaN) and NaN elements. Groups: "1x32" (32 consecutive values; a last group may be shorter) or "wrapx"
(Trainium's wrapped groups inside tiles of 128; the axis length must be a multiple of 128).

Dtypes: inputs are float32, ml_dtypes.bfloat16 or float16; float64 (numpy's default) and Python numbers or lists
are accepted and rounded once to float32 (to nearest, ties to even), so the result equals that of
``x.astype(np.float32)``. Element codes are ml_dtypes.float8_e4m3fn / float8_e5m2 arrays; scales are uint8 E8M0
codes (value 2^(code - 127)), ml_dtypes.float8_e8m0fnu arrays are accepted too.
"""

import ctypes

import numpy as np

from . import _lib
from ._lib import MXFP8Error  # noqa: F401

__all__ = ["quantize", "dequantize", "quantization_metadata", "scale_layout_shape", "to_scale_layout", "from_scale_layout", "pack_x4",
           "unpack_x4", "swizzle_nki", "unswizzle_nki", "info", "set_num_threads"]


def _norm_axis(axis, ndim, param="axis"):
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{param}: expected an int, got {type(axis).__name__}")
    a = int(axis)
    if not -ndim <= a < ndim:
        raise ValueError(f"{param}: {a} is out of range for a {ndim}-D array")
    return a % ndim


def quantize(x, fmt="e4m3", axis=-1, scale_rule="nki", group="1x32", rounding="nearest", seed=0, stats=False, *,
             stream=0):
    """MX-quantize `x` along `axis`.

    x: array of float32, ml_dtypes.bfloat16 or float16 (Python floats become float32), rank >= 1, any strides.
    fmt: "e4m3" | "e5m2" (or the ml_dtypes float8 dtype). scale_rule: "nki" | "ocp" | "rceil".
    group: "1x32" | "wrapx" (wrapx needs x.shape[axis] % 128 == 0).
    rounding: "nearest" (round to nearest even, the default) | "stochastic": each element rounds up with probability
    equal to its fraction of an FP8 ulp (within 2^-32), from Philox-4x32-10 keyed by (seed, stream) and indexed by
    the element's row-major position in x, so the result depends only on (seed, stream, x), never on threads or the
    ISA path (the exact rule is in mxfp8.h, "Stochastic rounding"). seed, stream: ints in [0, 2**64).
    stats: also return the quantization's statistics (see below).
    Returns (data, scales), or (data, scales, stats) with stats=True: data has x's shape and dtype
    ml_dtypes.float8_e4m3fn / float8_e5m2; scales are uint8 E8M0 codes (scale = 2^(code-127), 255 = NaN) of shape
    x.shape with axis replaced by ceil(len/32), in compact group order; stats is a dict with elements, groups,
    saturated (|x / 2^e| above max normal before clamping), flushed_to_zero (x != 0 with a zero code), subnormal
    (subnormal codes), nonfinite_groups, zero_groups, scale_histogram (256 ints), sum_sq_error, sum_sq_signal and
    sqnr_db. Raises TypeError (x's dtype, naming the accepted ones), ValueError (bad option, axis), MXFP8Error
    (the library's checks, e.g. wrapx with a length not a multiple of 128).
    """
    f = _lib.parse_format(fmt, "fmt")
    rule = _lib.parse(_lib.SCALE_RULES, scale_rule, "scale_rule")
    grp = _lib.parse(_lib.GROUPS, group, "group")
    rnd = _lib.parse(_lib.ROUNDINGS, rounding, "rounding")
    seed, stream = _lib.parse_seed(seed, "seed"), _lib.parse_seed(stream, "stream")
    want_stats = _lib.parse_bool(stats, "stats")
    x = _lib.as_array(x, allowed=(_lib.F32, _lib.BF16, _lib.F16), name="x")  # TypeError as matmul's inputs
    if x.ndim == 0:
        raise ValueError("x: quantization needs an array of rank >= 1")
    ax = _norm_axis(axis, x.ndim)
    data = _lib.empty(x.shape, _lib.FORMAT_DTYPE[f])
    sshape = list(x.shape)
    sshape[ax] = -(-x.shape[ax] // 32)
    scales = _lib.empty(sshape, _lib.U8)
    st = _lib.QuantStats()
    params = _lib.QuantParams(f, rule, grp, rnd, seed, stream, ctypes.addressof(st) if want_stats else None)
    vx, vd, vs = _lib.view(x, name="x"), _lib.view(data), _lib.view(scales)
    _lib.call("mxfp8_quantize", _lib.ref(vx), ax, _lib.ref(params), _lib.ref(vd), _lib.ref(vs))
    if want_stats:
        return data, scales, _lib.stats_dict(st)
    return data, scales


def dequantize(data, scales, axis=-1, group="1x32", out_dtype="float32", fmt=None):
    """Dequantize MX codes: out = fp8(data) * 2^(scales - 127) (scale code 255 gives NaN).

    Parameters
    ----------
    data : array, rank >= 1
        ml_dtypes.float8_e4m3fn / float8_e5m2 codes, or uint8 codes together with `fmt`.
    scales : array
        uint8 E8M0 codes (or ml_dtypes.float8_e8m0fnu) of data's shape with ``axis`` replaced by ceil(len / 32), as
        returned by `quantize` for the same `axis` and `group`.
    axis : int
        The axis the groups run along.
    group : "1x32" | "wrapx"
        The group scheme the codes were made with.
    out_dtype : "float32" (default) | "bfloat16" | "float16" | "float64", or the numpy / ml_dtypes dtype
        float32 and float64 hold every dequantized value exactly; bfloat16 / float16 round to nearest even.
    fmt : "e4m3" | "e5m2" | None
        Element format of uint8 codes; when data is a float8 array it must agree with data's dtype.

    Returns
    -------
    array of data's shape and dtype `out_dtype`.

    Raises
    ------
    TypeError (dtypes), ValueError (options, fmt disagreeing with data), MXFP8Error (the library's checks, e.g.
    scales of the wrong shape).
    """
    as_f64 = isinstance(out_dtype, str) and out_dtype.strip().lower() in ("float64", "f64")
    if not isinstance(out_dtype, str):
        try:
            as_f64 = np.dtype(out_dtype) == np.float64
        except TypeError:
            as_f64 = False
    code_out = _lib.F32 if as_f64 else _lib.parse_out_dtype(out_dtype, "out_dtype")
    grp = _lib.parse(_lib.GROUPS, group, "group")
    data = _lib.as_array(data, allowed=(_lib.E4M3, _lib.E5M2, _lib.U8), name="data")
    scales = _lib.as_array(scales, allowed=(_lib.U8, _lib.E8M0), name="scales")
    dcode = None
    if fmt is not None:
        f = _lib.parse_format(fmt, "fmt")
        dcode = _lib.FORMAT_DTYPE[f]
        if data.dtype == np.uint8:
            pass
        elif _lib.dtype_code(data.dtype) != dcode:
            raise ValueError(f"fmt: {fmt!r} disagrees with data's dtype {data.dtype}")
    elif data.dtype == np.uint8:
        raise ValueError("data: uint8 codes need fmt='e4m3' or fmt='e5m2' to say which FP8 format they hold "
                         "(or pass an ml_dtypes float8_e4m3fn / float8_e5m2 array)")
    if data.ndim == 0:
        raise ValueError("data: dequantization needs an array of rank >= 1")
    ax = _norm_axis(axis, data.ndim)
    out = _lib.empty(data.shape, code_out)
    scode = _lib.U8 if scales.dtype == np.uint8 else None
    vd, vs, vo = _lib.view(data, dcode, "data"), _lib.view(scales, scode, "scales"), _lib.view(out)
    _lib.call("mxfp8_dequantize", _lib.ref(vd), _lib.ref(vs), ax, grp, _lib.ref(vo))
    return out.astype(np.float64) if as_f64 else out  # exact: every dequantized value is a float32


def scale_layout_shape(layout, rows, K):
    """Shape (rows', cols') of the scales of an operand with `rows` non-contracted rows (F) and `K` contraction
    indices (G = ceil(K / 32) groups) in `layout`:

      "compact"        [F, G]: scale of row f, group g at [f, g] (what `quantize` returns for a [F, K] operand
                       quantized along its last axis).
      "nki_unpacked"   [ceil(G / 4) * 32, F]: NKI's quadrant layout; group g of column f at row (g // 4) * 32 + g % 4.
      "nki_packed"     [ceil(K / 2048) * 128, F]: NKI's packed layout; group g at row
                       (g // 64) * 128 + ((g % 64) // 16) * 4 + ((g % 16) // 4) * 32 + g % 4.
      "swizzle_128x4"  [R', C'] with R' = F rounded up to 128 and C' = G rounded up to 4: the cuBLAS / CUTLASS
                       block-scaled swizzle, flat offset ((r // 128) * (C' // 4) + c // 4) * 512 + (r % 32) * 16
                       + ((r % 128) // 32) * 4 + c % 4.
    Unused positions of the padded layouts hold 0. rows, K: ints >= 0. Raises ValueError (layout), MXFP8Error
    (negative or overflowing sizes)."""
    lay = _lib.parse(_lib.LAYOUTS, layout, "layout")
    shape = (ctypes.c_int64 * 2)()
    _lib.call("mxfp8_scale_layout_shape", lay, int(rows), int(K), shape)
    return (int(shape[0]), int(shape[1]))


def to_scale_layout(scales, K, layout):
    """Convert compact scales [F, ceil(K / 32)] (uint8 or float8_e8m0fnu E8M0 codes) of an operand with F rows and
    K contraction indices into `layout` ("compact" | "nki_unpacked" | "nki_packed" | "swizzle_128x4"; see
    `scale_layout_shape` for each layout's shape and addressing).

    Returns a uint8 array of shape ``scale_layout_shape(layout, F, K)``; unused positions are 0. Raises ValueError
    (layout, a scales array that is not 2-D), MXFP8Error (shape of scales vs K)."""
    scales = _lib.as_array(scales, name="scales")
    if scales.ndim != 2:
        raise ValueError(f"scales: expected a 2-D compact array [rows, ceil(K/32)], got shape {scales.shape}")
    out = _lib.zeros(scale_layout_shape(layout, scales.shape[0], K), _lib.U8)
    lay = _lib.parse(_lib.LAYOUTS, layout, "layout")
    vi, vo = _lib.view(scales, _lib.U8 if scales.dtype == np.uint8 else None), _lib.view(out)
    _lib.call("mxfp8_scales_to_layout", _lib.ref(vi), int(K), lay, _lib.ref(vo))
    return out


def from_scale_layout(scales, K, layout, rows=None):
    """Inverse of `to_scale_layout`: read uint8 / E8M0 scales in `layout` (a 2-D array of the shape
    `scale_layout_shape` gives) back into compact [rows, ceil(K / 32)] uint8 codes.

    rows: the operand's non-contracted extent F. Taken from the array for "compact" ([F, G]) and the NKI layouts
    ([., F]); "swizzle_128x4" pads rows to a multiple of 128, so it needs `rows`. Raises ValueError (layout, missing
    rows, a scales array that is not 2-D), MXFP8Error (shapes)."""
    lay = _lib.parse(_lib.LAYOUTS, layout, "layout")
    scales = _lib.as_array(scales, name="scales")
    if scales.ndim != 2:
        raise ValueError(f"scales: expected a 2-D array, got shape {scales.shape}")
    if rows is None:
        if lay == _lib.LAYOUTS["compact"]:
            rows = scales.shape[0]
        elif lay in (_lib.LAYOUTS["nki_unpacked"], _lib.LAYOUTS["nki_packed"]):
            rows = scales.shape[1]
        else:
            raise ValueError("rows: the swizzle_128x4 layout pads rows to a multiple of 128; give rows")
    out = _lib.zeros((int(rows), -(-int(K) // 32)), _lib.U8)
    vi, vo = _lib.view(scales, _lib.U8 if scales.dtype == np.uint8 else None), _lib.view(out)
    _lib.call("mxfp8_scales_from_layout", _lib.ref(vi), int(K), lay, _lib.ref(vo))
    return out


def pack_x4(data, axis=-1):
    """Pack FP8 codes four to a uint32 word along `axis` (NKI's x4 element packing).

    data: ml_dtypes.float8_e4m3fn / float8_e5m2 or uint8 codes [..., L, ...] (L along `axis`), rank >= 1.
    Returns uint32 words [..., ceil(L / 4), ...]: byte c (least significant first) of word p is element 4p + c; a
    missing tail is zero. Raises ValueError (0-d data, axis), MXFP8Error (dtype)."""
    data = _lib.as_array(data, name="data")
    if data.ndim == 0:
        raise ValueError("data: packing needs an array of rank >= 1")
    ax = _norm_axis(axis, data.ndim)
    shape = list(data.shape)
    shape[ax] = -(-shape[ax] // 4)
    out = _lib.empty(shape, _lib.U32)
    vi, vo = _lib.view(data, name="data"), _lib.view(out)
    _lib.call("mxfp8_pack_x4", _lib.ref(vi), ax, _lib.ref(vo))
    return out


def unpack_x4(words, length, axis=-1, fmt="e4m3"):
    """Inverse of `pack_x4`: uint32 words [..., W, ...] -> `length` FP8 codes along `axis` (length <= 4 W).

    fmt: "e4m3" | "e5m2" gives an ml_dtypes float8 array; None gives uint8 codes. Returns the codes
    [..., length, ...]. Raises ValueError (negative length, axis), MXFP8Error (length past the words)."""
    words = _lib.as_array(words, name="words")
    if words.ndim == 0:
        raise ValueError("words: unpacking needs an array of rank >= 1")
    ax = _norm_axis(axis, words.ndim)
    code = _lib.U8 if fmt is None else _lib.FORMAT_DTYPE[_lib.parse_format(fmt, "fmt")]
    length = int(length)
    if length < 0:
        raise ValueError(f"length: {length} is negative")
    shape = list(words.shape)
    shape[ax] = length
    out = _lib.empty(shape, code)
    vi, vo = _lib.view(words, name="words"), _lib.view(out)
    _lib.call("mxfp8_unpack_x4", _lib.ref(vi), ax, _lib.ref(vo))
    return out


def swizzle_nki(x):
    """NKI's swizzle of an operand [K, F] (contraction axis K first, any dtype) into [K / 4, 4 F].

    The K axis is cut as the "wrapx" groups cut it (tiles of 512, the remainder in 256 / 128 subtiles); for a
    (sub)tile at k0 of size P, S = P / 4: ``out[k0/4 + p, 4f + s] = x[k0 + s*S + p, f]``. K must be a multiple of
    128 (MXFP8Error otherwise). Returns an array of x's dtype. Raises ValueError (x not 2-D)."""
    x = _lib.as_array(x)
    if x.ndim != 2:
        raise ValueError(f"x: expected a 2-D array [K, F], got shape {x.shape}")
    vi = _lib.view(x, name="x")
    out = _lib.empty((x.shape[0] // 4, 4 * x.shape[1]), vi.dtype)
    vo = _lib.view(out)
    _lib.call("mxfp8_swizzle_nki", _lib.ref(vi), _lib.ref(vo))
    return out


def unswizzle_nki(x):
    """Inverse of `swizzle_nki`: x [K / 4, 4 F] (any dtype) -> [K, F] of x's dtype. Raises ValueError (x not 2-D),
    MXFP8Error (K not a multiple of 128)."""
    x = _lib.as_array(x)
    if x.ndim != 2:
        raise ValueError(f"x: expected a 2-D array [K/4, 4F], got shape {x.shape}")
    vi = _lib.view(x, name="x")
    out = _lib.empty((4 * x.shape[0], x.shape[1] // 4), vi.dtype)
    vo = _lib.view(out)
    _lib.call("mxfp8_unswizzle_nki", _lib.ref(vi), _lib.ref(vo))
    return out


def info():
    """Facts about the loaded library, as a dict: "version" (str), "library" (path of the shared library),
    "isa" ("scalar" | "avx512" | "amx": the ISA level in use, after MXFP8_ISA and the CPU checks), "isa_reason"
    (why), "num_threads" (threads a call uses), the CPU features "has_avx512f", "has_avx512bw", "has_avx512vl",
    "has_avx512_bf16", "has_amx_tile", "has_amx_bf16", "amx_permitted" (bools), and "kernels": for each slot
    ("gemm", "quantize", "dequantize") a dict with "kernel" (the kernel in use), "isa" (its instructions),
    "self_test" (bool: it passed its start-up self-test) and "note" (why a faster kernel of this CPU is not in
    use, or ""), and "cpu_features": every CPU feature the library detects, name -> bool (a superset of the has_*
    entries, growing with the library)."""
    inf = _lib.Info()
    _lib.call("mxfp8_get_info", _lib.ref(inf))
    features = {}
    for i in range(_lib.function("mxfp8_cpu_feature_count")()):
        name, value = ctypes.c_char_p(), ctypes.c_int()
        _lib.call("mxfp8_cpu_feature", i, _lib.ref(name), _lib.ref(value))
        features[name.value.decode()] = bool(value.value)
    ver = _lib.function("mxfp8_version_string")()
    return {
        "version": ver.decode() if ver else "",
        "library": _lib.library_path(),
        "isa": inf.isa_name.decode() if inf.isa_name else _lib.ISAS.get(inf.isa, "?"),
        "isa_reason": inf.isa_reason.decode() if inf.isa_reason else "",
        "num_threads": int(inf.num_threads),
        "has_avx512f": bool(inf.has_avx512f),
        "has_avx512bw": bool(inf.has_avx512bw),
        "has_avx512vl": bool(inf.has_avx512vl),
        "has_avx512_bf16": bool(inf.has_avx512_bf16),
        "has_amx_tile": bool(inf.has_amx_tile),
        "has_amx_bf16": bool(inf.has_amx_bf16),
        "amx_permitted": bool(inf.amx_permitted),
        "cpu_features": features,
        "kernels": {
            k.slot.decode(): {"kernel": k.kernel.decode(), "isa": k.isa.decode(), "self_test": bool(k.self_test),
                              "note": k.note.decode() if k.note else ""}
            for k in inf.kernels
        },
    }


def set_num_threads(n):
    """Set the number of threads every later library call uses, process-wide.

    n: int >= 0; 0 returns to the default (MXFP8_NUM_THREADS, else OMP_NUM_THREADS, else all cores); values above
    4096 are clamped. Results never depend on it (bitwise). Raises TypeError (not an int), MXFP8Error (negative)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"n: expected an int, got {type(n).__name__}")
    _lib.call("mxfp8_set_num_threads", int(n))


def _name_of(table, code):
    return next(k for k, v in table.items() if v == code)


def quantization_metadata(ndim, fmt="e4m3", axis=-1, scale_rule="nki", group="1x32", rounding="nearest"):
    """The safetensors metadata that describes `data` and `scales` made by ``quantize(x, fmt, axis, scale_rule,
    group, rounding)`` of an ndim-D x: the keys the ``mxfp8 quantize`` command writes, which ``mxfp8 dequantize`` and
    ``mxfp8 diff`` read (their defaults, and a contradicting flag is an error):

    mx.format "e4m3" | "e5m2", mx.scale_rule "nki" | "ocp" | "rceil", mx.group "1x32" | "wrapx", mx.axis (0-based),
    mx.scale_layout "compact", mx.rounding "nearest" | "stochastic".

    Write a self-describing file with ``mxfp8.save(path, {"data": data, "scales": scales},
    metadata=quantization_metadata(x.ndim, ...))``; read it back with ``mxfp8.load(path, with_metadata=True)``.
    Raises ValueError / TypeError for options quantize would refuse."""
    if isinstance(ndim, bool) or not isinstance(ndim, (int, np.integer)) or ndim < 1:
        raise ValueError(f"ndim: expected an int >= 1, got {ndim!r}")
    return {"mx.format": _lib.FORMAT_NAMES[_lib.parse_format(fmt)],
            "mx.scale_rule": _name_of(_lib.SCALE_RULES, _lib.parse(_lib.SCALE_RULES, scale_rule, "scale_rule")),
            "mx.group": _name_of(_lib.GROUPS, _lib.parse(_lib.GROUPS, group, "group")),
            "mx.axis": str(_norm_axis(axis, int(ndim))), "mx.scale_layout": "compact",
            "mx.rounding": _name_of(_lib.ROUNDINGS, _lib.parse(_lib.ROUNDINGS, rounding, "rounding"))}
