"""MX quantization, dequantization, scale layouts and element packing (numpy / ml_dtypes front end of libmxfp8).

Rules [OCP MX v1.0 §6.3], [NKI quantize_mx]: groups of 32 values along `axis` share one E8M0 scale 2^e; elements
are RNE(x * 2^-e) in FP8 (E4M3 or E5M2), saturating to +-max normal. Scale rules: "nki" (default,
e = floor(log2 amax) - (emax-1)), "ocp" (floor(log2 amax) - emax), "rceil" (ceil(log2(amax / max_normal))).
All-zero group -> scale code 0; any NaN/Inf in a group -> scale code 255 and NaN elements. Groups: "1x32"
(contiguous) or "wrapx" (Trainium's; the axis length must be a multiple of 128).
"""

import ctypes

import numpy as np

from . import _lib
from ._lib import MXFP8Error  # noqa: F401

__all__ = ["quantize", "dequantize", "scale_layout_shape", "to_scale_layout", "from_scale_layout", "pack_x4",
           "unpack_x4", "swizzle_nki", "unswizzle_nki", "info", "set_num_threads"]


def _norm_axis(axis, ndim, param="axis"):
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{param}: expected an int, got {type(axis).__name__}")
    a = int(axis)
    if not -ndim <= a < ndim:
        raise ValueError(f"{param}: {a} is out of range for a {ndim}-D array")
    return a % ndim


def quantize(x, fmt="e4m3", axis=-1, scale_rule="nki", group="1x32"):
    """MX-quantize `x` along `axis`.

    x: array of float32, ml_dtypes.bfloat16 or float16 (Python floats become float32), rank >= 1, any strides.
    fmt: "e4m3" | "e5m2" (or the ml_dtypes float8 dtype). scale_rule: "nki" | "ocp" | "rceil".
    group: "1x32" | "wrapx" (wrapx needs x.shape[axis] % 128 == 0).
    Returns (data, scales): data has x's shape and dtype ml_dtypes.float8_e4m3fn / float8_e5m2; scales are uint8
    E8M0 codes (scale = 2^(code-127), 255 = NaN) of shape x.shape with axis replaced by ceil(len/32), in compact
    group order. Raises TypeError (x's dtype, naming the accepted ones), ValueError (bad option, axis), MXFP8Error
    (the library's checks, e.g. wrapx with a length not a multiple of 128).
    """
    f = _lib.parse_format(fmt, "fmt")
    rule = _lib.parse(_lib.SCALE_RULES, scale_rule, "scale_rule")
    grp = _lib.parse(_lib.GROUPS, group, "group")
    x = _lib.as_array(x, allowed=(_lib.F32, _lib.BF16, _lib.F16), name="x")  # TypeError as matmul's inputs
    if x.ndim == 0:
        raise ValueError("x: quantization needs an array of rank >= 1")
    ax = _norm_axis(axis, x.ndim)
    data = _lib.empty(x.shape, _lib.FORMAT_DTYPE[f])
    sshape = list(x.shape)
    sshape[ax] = -(-x.shape[ax] // 32)
    scales = _lib.empty(sshape, _lib.U8)
    params = _lib.QuantParams(f, rule, grp)
    vx, vd, vs = _lib.view(x, name="x"), _lib.view(data), _lib.view(scales)
    _lib.call("mxfp8_quantize", _lib.ref(vx), ax, _lib.ref(params), _lib.ref(vd), _lib.ref(vs))
    return data, scales


def dequantize(data, scales, axis=-1, group="1x32", out_dtype="float32", fmt=None):
    """Dequantize MX codes: out = fp8(data) * 2^(scales - 127), exact in float32 (rounded RNE for bfloat16/float16);
    scale code 255 gives NaN.

    data: ml_dtypes.float8_e4m3fn / float8_e5m2 array (or uint8 codes with `fmt` given). scales: uint8 E8M0 codes
    (or ml_dtypes.float8_e8m0fnu) as returned by quantize for the same `axis` and `group`.
    out_dtype: "float32" | "bfloat16" | "float16" (or the numpy/ml_dtypes dtype). Returns an array of data's shape.
    """
    code_out = _lib.parse_out_dtype(out_dtype, "out_dtype")
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
    if data.ndim == 0:
        raise ValueError("data: dequantization needs an array of rank >= 1")
    ax = _norm_axis(axis, data.ndim)
    out = _lib.empty(data.shape, code_out)
    scode = _lib.U8 if scales.dtype == np.uint8 else None
    vd, vs, vo = _lib.view(data, dcode, "data"), _lib.view(scales, scode, "scales"), _lib.view(out)
    _lib.call("mxfp8_dequantize", _lib.ref(vd), _lib.ref(vs), ax, grp, _lib.ref(vo))
    return out


def scale_layout_shape(layout, rows, K):
    """Shape (2-tuple) of the scales of an operand with `rows` non-contracted rows and K contraction indices in
    `layout` ("compact" | "nki_unpacked" | "nki_packed" | "swizzle_128x4")."""
    lay = _lib.parse(_lib.LAYOUTS, layout, "layout")
    shape = (ctypes.c_int64 * 2)()
    _lib.call("mxfp8_scale_layout_shape", lay, int(rows), int(K), shape)
    return (int(shape[0]), int(shape[1]))


def to_scale_layout(scales, K, layout):
    """Convert compact scales [rows, ceil(K/32)] (uint8 codes) of an operand with K contraction indices into
    `layout` (see scale_layout_shape). Unused positions are zero. Returns a uint8 array."""
    scales = _lib.as_array(scales, name="scales")
    if scales.ndim != 2:
        raise ValueError(f"scales: expected a 2-D compact array [rows, ceil(K/32)], got shape {scales.shape}")
    out = _lib.zeros(scale_layout_shape(layout, scales.shape[0], K), _lib.U8)
    lay = _lib.parse(_lib.LAYOUTS, layout, "layout")
    vi, vo = _lib.view(scales, _lib.U8 if scales.dtype == np.uint8 else None), _lib.view(out)
    _lib.call("mxfp8_scales_to_layout", _lib.ref(vi), int(K), lay, _lib.ref(vo))
    return out


def from_scale_layout(scales, K, layout, rows=None):
    """Inverse of to_scale_layout: read scales in `layout` back into compact [rows, ceil(K/32)] uint8.
    `rows` (the operand's non-contracted extent) is taken from the array for the compact and NKI layouts; the
    swizzle_128x4 layout pads rows to 128, so it needs `rows`."""
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
    """Pack FP8 codes four to a uint32 word along `axis`: byte c (least significant first) of word p is element
    4p+c; a missing tail is zero. data: float8_e4m3fn / float8_e5m2 / uint8. Returns uint32 [..., ceil(L/4), ...]."""
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
    """Inverse of pack_x4: uint32 words -> `length` FP8 codes along `axis` (dtype from fmt: "e4m3" | "e5m2", or
    None for uint8)."""
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
    """NKI swizzle of an operand [K, F] (contraction axis first) into [K/4, 4F]: for each wrapX (sub)tile at k0 of
    size P (S = P/4), out[k0/4 + p, 4f + s] = x[k0 + s*S + p, f]. K must be a multiple of 128."""
    x = _lib.as_array(x)
    if x.ndim != 2:
        raise ValueError(f"x: expected a 2-D array [K, F], got shape {x.shape}")
    vi = _lib.view(x, name="x")
    out = _lib.empty((x.shape[0] // 4, 4 * x.shape[1]), vi.dtype)
    vo = _lib.view(out)
    _lib.call("mxfp8_swizzle_nki", _lib.ref(vi), _lib.ref(vo))
    return out


def unswizzle_nki(x):
    """Inverse of swizzle_nki: [K/4, 4F] -> [K, F]."""
    x = _lib.as_array(x)
    if x.ndim != 2:
        raise ValueError(f"x: expected a 2-D array [K/4, 4F], got shape {x.shape}")
    vi = _lib.view(x, name="x")
    out = _lib.empty((4 * x.shape[0], x.shape[1] // 4), vi.dtype)
    vo = _lib.view(out)
    _lib.call("mxfp8_unswizzle_nki", _lib.ref(vi), _lib.ref(vo))
    return out


def info():
    """Library facts: version, path of the shared library, CPU features, the ISA level in use (and why), threads,
    and ``kernels``: for each slot ("gemm", "quantize", "dequantize") the kernel in use, its instruction set,
    whether it passed its start-up self-test, and a note on any faster kernel of this CPU that is not in use."""
    inf = _lib.Info()
    _lib.call("mxfp8_get_info", _lib.ref(inf))
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
        "kernels": {
            k.slot.decode(): {"kernel": k.kernel.decode(), "isa": k.isa.decode(), "self_test": bool(k.self_test),
                              "note": k.note.decode() if k.note else ""}
            for k in inf.kernels
        },
    }


def set_num_threads(n):
    """Threads every later library call uses, process-wide (0 = back to MXFP8_NUM_THREADS / OMP_NUM_THREADS / all
    cores). Results never depend on it."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"n: expected an int, got {type(n).__name__}")
    _lib.call("mxfp8_set_num_threads", int(n))
