"""Why do two stacks' MXFP8 bits differ? mxfp8.diff re-quantizes a high-precision tensor under every quantization
profile of the library (scale rule x element rounding x NaN/Inf policy x saturation x sign of zero), reports the
profile that reproduces another stack's codes and scales best, and classifies the groups it does not reproduce.

    d = mxfp8.diff(x, data, scales)            # data, scales: another stack's result for x
    d["bitwise_equal"], d["profile"]["name"], d["unexplained"]["tiny"]["examples"]

Classes (the first that applies): "nonfinite" (a NaN / Inf in the group), "tiny" (amax < 2^(emax - 126): the shared
exponent near E8M0's floor), "zero-sign" (only zeros of the other sign differ), "saturation" (an element beyond max
normal, or a NaN / Inf code for a finite input), "pow2" (scales one step apart with amax within 2^-16 of 2^k or
max_normal * 2^k: a floating-point log2 instead of the exponent bits), "subnormal" (only FP8 subnormals differ),
"other". `mxfp8 diff` is the same on files.
"""

import ctypes

import numpy as np

from . import _lib
from .quant import _norm_axis

__all__ = ["diff", "quantize_profile", "PROFILE_FIELDS", "DIFF_CLASSES"]

DIFF_CLASSES = ("nonfinite", "tiny", "zero-sign", "saturation", "pow2", "subnormal", "rounding", "other")
PROFILE_FIELDS = ("scale_rule", "rounding", "nonfinite", "saturation", "zero")
_RULES = _lib.EnumNames(_lib.ENUM_SCALE_RULE)


class _Profile(ctypes.Structure):
    _c_name = "mxfp8_quant_profile"
    _fields_ = [("rule", ctypes.c_int), ("round_toward_zero", ctypes.c_int), ("nonfinite_per_element", ctypes.c_int),
                ("no_saturation", ctypes.c_int), ("unsigned_zero", ctypes.c_int)]


class _DiffResult(ctypes.Structure):
    _c_name = "mxfp8_diff_result"
    _fields_ = [("groups", ctypes.c_int64), ("num_profiles", ctypes.c_int), ("matched", ctypes.c_int64 * 48),
                ("best", ctypes.c_int), ("unexplained", ctypes.c_int64 * 8), ("example", ctypes.c_int64 * 32),
                ("unmatched_by_all", ctypes.c_int64)]


def _declare():
    P, I = ctypes.c_void_p, ctypes.c_int
    _lib.declare("mxfp8_diff_num_profiles", I, [])
    _lib.declare("mxfp8_diff_profile", I, [I, P])
    _lib.declare("mxfp8_quantize_profile", I, [P, I, I, I, P, P, P])
    _lib.declare("mxfp8_diff", I, [P, I, I, I, P, P, P])


def _describe(p):
    d = {"scale_rule": _RULES[p.rule], "rounding": "toward_zero" if p.round_toward_zero else "nearest_even",
         "nonfinite": "per_element" if p.nonfinite_per_element else "nan_group",
         "saturation": "none" if p.no_saturation else "saturate", "zero": "unsigned" if p.unsigned_zero else "signed"}
    d["name"] = "/".join(d[k] for k in PROFILE_FIELDS)
    return d


def _profile(i):
    p = _Profile()
    _lib.call("mxfp8_diff_profile", int(i), ctypes.byref(p))
    return p


def _prep(x, data, scales, fmt, axis, group):
    x = _lib.as_array(x, allowed=(_lib.F32, _lib.BF16, _lib.F16), name="x")
    if x.ndim == 0:
        raise ValueError("x: needs an array of rank >= 1")
    grp = _lib.parse(_lib.GROUPS, group, "group")
    data = _lib.as_array(data, allowed=(_lib.E4M3, _lib.E5M2, _lib.U8), name="data")
    if fmt is None:
        if data.dtype == np.uint8:
            raise ValueError('fmt: give the element format of uint8 codes ("e4m3" | "e5m2")')
        f = 1 if _lib.dtype_code(data.dtype) == _lib.E5M2 else 0
    else:
        f = _lib.parse_format(fmt, "fmt")
    if data.shape != x.shape:
        raise ValueError(f"data: the codes must have x's shape {x.shape}, got {data.shape}")
    sc = _lib.as_array(scales, allowed=(_lib.U8, _lib.E8M0), name="scales")
    if axis is None:  # the axis where the scales' shape differs from the data's
        diffs = [d for d in range(x.ndim) if sc.ndim == x.ndim and sc.shape[d] != x.shape[d]]
        axis = diffs[0] if len(diffs) == 1 else -1
    ax = int(axis) % x.ndim if -x.ndim <= int(axis) < x.ndim else int(axis)
    vx = _lib.view(x, name="x")
    vd = _lib.view(data, _lib.U8 if data.dtype == np.uint8 else None, "data")
    vs = _lib.view(sc, _lib.U8 if sc.dtype == np.uint8 else None, "scales")
    return vx, vd, vs, sc.shape, f, ax, grp


def quantize_profile(x, fmt="e4m3", axis=-1, group="1x32", *, scale_rule="nki", rounding="nearest_even",
                     nonfinite="nan_group", saturation="saturate", zero="signed"):
    """MX-quantize x under one profile. x, fmt, axis, group: as for mxfp8.quantize; the profile's fields as diff
    names them: scale_rule "nki" | "ocp" | "rceil", rounding "nearest_even" | "toward_zero", nonfinite "nan_group" |
    "per_element", saturation "saturate" | "none", zero "signed" | "unsigned". Returns (data, scales) as
    mxfp8.quantize does; the defaults give mxfp8.quantize's bits (nearest rounding)."""
    _declare()
    x = _lib.as_array(x, allowed=(_lib.F32, _lib.BF16, _lib.F16), name="x")
    if x.ndim == 0:
        raise ValueError("x: needs an array of rank >= 1")
    f = _lib.parse_format(fmt, "fmt")
    ax = _norm_axis(axis, x.ndim)  # an axis out of range is an error, never wrapped round
    p = _Profile(_lib.parse(_lib.SCALE_RULES, scale_rule, "scale_rule"),
                 _lib.parse({"nearest_even": 0, "toward_zero": 1}, rounding, "rounding"),
                 _lib.parse({"nan_group": 0, "per_element": 1}, nonfinite, "nonfinite"),
                 _lib.parse({"saturate": 0, "none": 1}, saturation, "saturation"),
                 _lib.parse({"signed": 0, "unsigned": 1}, zero, "zero"))
    data = _lib.empty(x.shape, _lib.FORMAT_DTYPE[f])
    sshape = list(x.shape)
    sshape[ax] = -(-x.shape[ax] // 32)
    scales = _lib.empty(sshape, _lib.U8)
    vx, vd, vs = _lib.view(x, name="x"), _lib.view(data), _lib.view(scales)
    _lib.call("mxfp8_quantize_profile", _lib.ref(vx), ax, f, _lib.parse(_lib.GROUPS, group, "group"),
              ctypes.byref(p), _lib.ref(vd), _lib.ref(vs))
    return data, scales


def diff(x, data, scales, fmt=None, axis=None, group="1x32"):
    """Compare another stack's MX quantization (data: FP8 codes of x's shape, ml_dtypes float8 or uint8 with `fmt`;
    scales: uint8 / float8_e8m0fnu E8M0 codes, compact, x's shape with the axis replaced by ceil(len/32)) of the
    high-precision x along `axis` (None: the axis where the scales' shape differs) with every profile.

    Returns a dict: bitwise_equal (the best profile reproduces every group), profile (the best: its fields of
    PROFILE_FIELDS and "name"), matched (groups it reproduces), groups, profiles ([(name, groups reproduced)] for
    every profile), unmatched_by_all (groups no profile reproduces) and unexplained ({class: {"count": n,
    "examples": [multi-index of the group in the scales array]}} over DIFF_CLASSES, for the groups the best profile
    does not reproduce). Raises TypeError / ValueError for bad arguments, MXFP8Error for the library's checks."""
    _declare()
    vx, vd, vs, sshape, f, ax, grp = _prep(x, data, scales, fmt, axis, group)
    r = _DiffResult()
    _lib.call("mxfp8_diff", _lib.ref(vx), ax, f, grp, _lib.ref(vd), _lib.ref(vs), ctypes.byref(r))
    n = int(r.num_profiles)
    profiles = [(_describe(_profile(i))["name"], int(r.matched[i])) for i in range(n)]
    best = _describe(_profile(r.best))
    unexplained = {}
    for c, name in enumerate(DIFF_CLASSES):
        ex = [tuple(int(v) for v in np.unravel_index(int(g), sshape)) for g in r.example[4 * c:4 * c + 4] if g >= 0]
        unexplained[name] = {"count": int(r.unexplained[c]), "examples": ex}
    return {"bitwise_equal": int(r.matched[r.best]) == int(r.groups), "profile": best,
            "matched": int(r.matched[r.best]), "groups": int(r.groups), "profiles": profiles,
            "unmatched_by_all": int(r.unmatched_by_all), "unexplained": unexplained}
