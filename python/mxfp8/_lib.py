"""Low-level bridge between numpy arrays and libmxfp8 (ctypes). Internal: the public API lives in quant.py,
matmul.py and moe.py, which are all written on the helpers below.

Loading
    ``lib()`` returns the loaded ``ctypes.CDLL``. The library is looked up, in order, at ``$MXFP8_LIBRARY`` (a path
    to a libmxfp8.so; for development), next to this file (the copy ``pip install .`` puts into the package), and
    finally at ``<repo>/build/libmxfp8.so`` when the package is imported from the source tree (``PYTHONPATH=python``).
    ``library_path()`` says which file was loaded.

Calling
    ``call(name, *args)`` calls the C function ``name`` and turns a non-zero ``mxfp8_status`` into
    ``MXFP8Error(status, message)`` (message = ``mxfp8_last_error_message()`` of the calling thread, read right after
    the call). Argument and return types of every public function are declared in ``_SIGNATURES`` (pointers to views
    and configs are ``c_void_p``-compatible: pass ``ctypes.byref(view)``). Python ints are converted to the declared
    C types (int64_t sizes, int axes). A function not declared there is called with ctypes' defaults, so declare it
    (``declare(name, restype, argtypes)``) before use when it takes int64 or float arguments.
    A symbol missing from the loaded library raises ``MXFP8Error(MXFP8_ERR_UNSUPPORTED, ...)``.

Tensor views
    ``Tensor`` mirrors ``struct mxfp8_tensor`` (data, dtype, ndim, shape[6], strides[6] in ELEMENTS).
    ``view(arr)`` makes a view of a numpy array with its real strides (in elements; negative strides allowed); the
    view keeps a reference to the array (``view.array``) so the buffer stays alive as long as the view does.
    Arrays whose byte strides are not a multiple of the itemsize are copied to a contiguous array first.
    ``none()`` is an absent optional tensor (data NULL). ``dtype_code(np_dtype)`` / ``np_dtype(code)`` map dtypes:

        numpy / ml_dtypes           mxfp8_dtype            numpy / ml_dtypes        mxfp8_dtype
        float32                     F32 (0)                uint8                    U8 (6)
        ml_dtypes.bfloat16          BF16 (1)               int32                    I32 (7)
        float16                     F16 (2)                float64                  F64 (8)
        ml_dtypes.float8_e4m3fn     E4M3 (3)               uint32                   U32 (9)
        ml_dtypes.float8_e5m2       E5M2 (4)               ml_dtypes.float8_e8m0fnu E8M0 (5)

    ``as_array(x, allowed=None, name="x")`` turns any array-like into a numpy array (Python floats -> float32;
    float64 arrays -> float32 where the parameter takes float32 but not float64) and checks its dtype against
    ``allowed`` (a tuple of dtype codes), raising ``TypeError`` naming the parameter.
    ``empty(shape, code)`` allocates an output array of an mxfp8 dtype code.

Enumerations (string -> C value; ``parse(table, value, param)`` raises ValueError naming ``param``; matching is
case-insensitive and also accepts the C integer value or, for formats, an ml_dtypes float8 dtype):
    FORMATS      {"e4m3": 0, "e5m2": 1}: ``fmt`` of quantize (any case, as the other options)
    FLOAT8_DTYPES {"float8_e4m3fn": 0, "float8_e5m2": 1}: ``float8_dtype`` / MoE ``fp8_x4_dtype`` (the NKI API's
                 strings, exact spelling; "float8_e4m3" is ml_dtypes' IEEE-like e4m3 -- a different format -- and
                 is rejected like any other string)
    SCALE_RULES  {"nki": 0, "ocp": 1, "rceil": 2}
    GROUPS       {"1x32": 0, "wrapx": 1}
    ROUNDINGS    {"nearest": 0, "stochastic": 1}: element rounding
    LAYOUTS      {"compact": 0, "nki_unpacked": 1, "nki_packed": 2, "swizzle_128x4": 3}
    OUT_DTYPES   {"float32": F32, "bfloat16": BF16, "float16": F16}  (also "f32", "bf16", "f16", numpy dtypes)
    ISAS         {0: "scalar", 1: "avx512", 2: "amx"}

Structs: ``QuantParams`` (mxfp8_quant_params), ``QuantStats`` (mxfp8_quant_stats; ``stats_dict``), ``Info``
(mxfp8_info). Config structs of matmul/MoE belong to their
modules; declare them there as ``ctypes.Structure`` mirrors, field for field with the C header mxfp8.h, each naming
its C struct in ``_c_name`` (the test suite compares every mirror's size and field offsets with
the C compiler's).
"""

import ctypes
from collections.abc import Mapping, Sequence
import os
import threading

import ml_dtypes
import numpy as np

MAX_DIMS = 6

# ---- status codes (fixed values, as in mxfp8.h) ----
OK = 0
ERR_NULL_POINTER = 1
ERR_INVALID_ARGUMENT = 2
ERR_SHAPE_MISMATCH = 3
ERR_DTYPE = 4
ERR_OUT_OF_MEMORY = 5
ERR_SIZE_OVERFLOW = 6
ERR_ALIASING = 7
ERR_INDEX_OUT_OF_RANGE = 8
ERR_UNSUPPORTED = 9
ERR_BAD_STRIDES = 10
ERR_INTERNAL = 11

STATUS_NAMES = {
    0: "MXFP8_OK", 1: "MXFP8_ERR_NULL_POINTER", 2: "MXFP8_ERR_INVALID_ARGUMENT", 3: "MXFP8_ERR_SHAPE_MISMATCH",
    4: "MXFP8_ERR_DTYPE", 5: "MXFP8_ERR_OUT_OF_MEMORY", 6: "MXFP8_ERR_SIZE_OVERFLOW", 7: "MXFP8_ERR_ALIASING",
    8: "MXFP8_ERR_INDEX_OUT_OF_RANGE", 9: "MXFP8_ERR_UNSUPPORTED", 10: "MXFP8_ERR_BAD_STRIDES",
    11: "MXFP8_ERR_INTERNAL",
}


class MXFP8Error(RuntimeError):
    """A libmxfp8 call failed. ``status`` is the mxfp8_status value (int), ``status_name`` its enum name and
    ``message`` the library's one-sentence explanation (names the parameter and the bad value)."""

    def __init__(self, status, message=""):
        self.status = int(status)
        self.status_name = STATUS_NAMES.get(self.status, "unknown status")
        self.message = message
        super().__init__(f"{self.status_name} ({self.status}): {message}" if message else self.status_name)

    def __reduce__(self):
        return (type(self), (self.status, self.message))


# ---- dtypes ----
F32, BF16, F16, E4M3, E5M2, E8M0, U8, I32, F64, U32 = range(10)

_NP_OF_CODE = {
    F32: np.dtype(np.float32),
    BF16: np.dtype(ml_dtypes.bfloat16),
    F16: np.dtype(np.float16),
    E4M3: np.dtype(ml_dtypes.float8_e4m3fn),
    E5M2: np.dtype(ml_dtypes.float8_e5m2),
    U8: np.dtype(np.uint8),
    I32: np.dtype(np.int32),
    F64: np.dtype(np.float64),
    U32: np.dtype(np.uint32),
}
if hasattr(ml_dtypes, "float8_e8m0fnu"):
    _NP_OF_CODE[E8M0] = np.dtype(ml_dtypes.float8_e8m0fnu)
_CODE_OF_NP = {dt: code for code, dt in _NP_OF_CODE.items()}
DTYPE_NAMES = {F32: "f32", BF16: "bf16", F16: "f16", E4M3: "e4m3", E5M2: "e5m2", E8M0: "e8m0", U8: "u8",
               I32: "i32", F64: "f64", U32: "u32"}


def dtype_code(dt):
    """mxfp8_dtype code of a numpy/ml_dtypes dtype; TypeError if it has none."""
    dt = np.dtype(dt)
    try:
        return _CODE_OF_NP[dt]
    except KeyError:
        raise TypeError(f"dtype {dt} has no mxfp8 equivalent") from None


def np_dtype(code):
    """numpy dtype of an mxfp8_dtype code (E8M0 -> ml_dtypes.float8_e8m0fnu when available, else uint8)."""
    if code == E8M0 and E8M0 not in _NP_OF_CODE:
        return np.dtype(np.uint8)
    return _NP_OF_CODE[code]


# ---- enumerations: the names are the library's (mxfp8_enum_name / mxfp8_enum_from_name), read when first used ----
ENUM_FORMAT, ENUM_FLOAT8_DTYPE, ENUM_SCALE_RULE, ENUM_GROUP_SCHEME, ENUM_SCALE_LAYOUT, ENUM_ROUNDING = range(6)
ENUM_ACTIVATION, ENUM_AFFINITY_OPTION, ENUM_LOOP_ORDER, ENUM_DTYPE, ENUM_MOE_OPERAND = range(6, 11)


class EnumTable(Mapping):
    """{name or alias: value} of one of the library's enumerations (mxfp8_enum), read from the library when first
    used. `parse` looks names up through mxfp8_enum_from_name, so the case rule and the error message are the
    library's; `names` are the canonical names by value."""

    def __init__(self, enum_id):
        self.enum_id = enum_id
        self._d = None
        self._names = None

    def _load(self):
        if self._d is None:
            L = lib()
            n = L.mxfp8_enum_count(self.enum_id)
            names = tuple(L.mxfp8_enum_name(self.enum_id, v).decode() for v in range(n))
            d = {}
            for v in range(n):
                d[names[v]] = v
                i = 0
                while (a := L.mxfp8_enum_alias(self.enum_id, v, i)) is not None:
                    d[a.decode()] = v
                    i += 1
            self._names, self._d = names, d
        return self._d

    @property
    def names(self):
        self._load()
        return self._names

    def __getitem__(self, key):
        return self._load()[key]

    def __iter__(self):
        return iter(self._load())

    def __len__(self):
        return len(self._load())

    def __repr__(self):
        return f"EnumTable({self._load()!r})"

    def parse(self, value, param):
        """The value of a name (canonical or alias) through the library; ValueError "param: <library message>"."""
        L = lib()
        v = ctypes.c_int32(0)
        name = value if self.enum_id == ENUM_FLOAT8_DTYPE else value.strip()  # float8_dtype: exactly the NKI string
        if L.mxfp8_enum_from_name(self.enum_id, name.encode(), ctypes.byref(v)) != 0:
            raise ValueError(f"{param}: {last_error_message()}")
        return v.value


class EnumNames(Sequence):
    """The canonical names of a library enumeration by value (a lazy tuple)."""

    def __init__(self, enum_id):
        self._t = EnumTable(enum_id)

    def __getitem__(self, i):
        return self._t.names[i]

    def __len__(self):
        return len(self._t.names)

    def __repr__(self):
        return repr(self._t.names)

    def __eq__(self, other):
        return tuple(self) == tuple(other)

    def __hash__(self):
        return hash(tuple(self))


FORMATS = EnumTable(ENUM_FORMAT)
FLOAT8_DTYPES = EnumTable(ENUM_FLOAT8_DTYPE)
FORMAT_NAMES = EnumNames(ENUM_FORMAT)
FORMAT_DTYPE = {0: E4M3, 1: E5M2}  # format -> dtype code of its element codes
SCALE_RULES = EnumTable(ENUM_SCALE_RULE)
GROUPS = EnumTable(ENUM_GROUP_SCHEME)
ROUNDINGS = EnumTable(ENUM_ROUNDING)
LAYOUTS = EnumTable(ENUM_SCALE_LAYOUT)
ACTIVATIONS = EnumTable(ENUM_ACTIVATION)
AFFINITY = EnumTable(ENUM_AFFINITY_OPTION)
LOOP_ORDERS = EnumTable(ENUM_LOOP_ORDER)
MOE_OPERANDS = EnumNames(ENUM_MOE_OPERAND)
OUT_DTYPES = {"float32": F32, "f32": F32, "bfloat16": BF16, "bf16": BF16, "float16": F16, "f16": F16}
ISAS = {0: "scalar", 1: "avx512", 2: "amx"}


def parse(table, value, param):
    """Look `value` up in an enumeration table (case-insensitive string, or one of the table's int values).
    Raises ValueError naming `param` and listing the accepted names."""
    if isinstance(value, str) and isinstance(table, EnumTable):
        return table.parse(value, param)
    if isinstance(value, str):
        key = value.strip().lower()
        if key in table:
            return table[key]
    elif isinstance(value, (int, np.integer)) and not isinstance(value, bool) and int(value) in table.values():
        return int(value)
    names = sorted({k for k in table})
    raise ValueError(f"{param}: unknown value {value!r} (expected one of {', '.join(names)})")


def parse_bool(value, param):
    """A flag: a Python / numpy bool or the integer 0 or 1 (unknown option values are errors -- "no" or 5
    are not silently taken as true). Returns 0 or 1; anything else raises ValueError (TypeError for a non-number)
    naming `param`."""
    if isinstance(value, (bool, np.bool_)):
        return int(bool(value))
    if isinstance(value, (int, np.integer)) and int(value) in (0, 1):
        return int(value)
    if isinstance(value, (int, np.integer)):
        raise ValueError(f"{param}: {value!r} is not a boolean (True/False or 0/1)")
    raise TypeError(f"{param}: {value!r} ({type(value).__name__}) is not a boolean (True/False or 0/1)")


def parse_format(value, param="fmt", names=None):
    """An element format from a name of `names` (default FORMATS: "e4m3", "e5m2", any case; FLOAT8_DTYPES for
    float8_dtype, spelled exactly), an int, or the ml_dtypes dtype float8_e4m3fn / float8_e5m2. Else ValueError."""
    names = FORMATS if names is None else names
    if not isinstance(value, (str, int, np.integer)):
        try:
            dt = np.dtype(value)
        except TypeError:
            dt = None
        if dt == np.dtype(ml_dtypes.float8_e4m3fn):
            return 0
        if dt == np.dtype(ml_dtypes.float8_e5m2):
            return 1
    return parse(names, value, param)  # names: the library's, its case rule and its hint for the other spelling


def parse_out_dtype(value, param="out_dtype"):
    """An output dtype code (F32/BF16/F16) from a name or a numpy dtype."""
    if not isinstance(value, str):
        try:
            code = _CODE_OF_NP.get(np.dtype(value))
        except TypeError:
            code = None
        if code in (F32, BF16, F16):
            return code
    return parse(OUT_DTYPES, value, param)


# ---- structs ----
class Tensor(ctypes.Structure):
    """Mirror of struct mxfp8_tensor."""

    _c_name = "mxfp8_tensor"

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("strides", ctypes.c_int64 * MAX_DIMS),
    ]

    def __repr__(self):
        n = self.ndim
        return (f"Tensor(dtype={DTYPE_NAMES.get(self.dtype, self.dtype)}, shape={list(self.shape[:n])}, "
                f"strides={list(self.strides[:n])}, data={'NULL' if not self.data else hex(self.data)})")


class QuantParams(ctypes.Structure):
    """Mirror of struct mxfp8_quant_params."""

    _c_name = "mxfp8_quant_params"

    _fields_ = [("fmt", ctypes.c_int), ("rule", ctypes.c_int), ("group", ctypes.c_int), ("rounding", ctypes.c_int),
                ("seed", ctypes.c_uint64), ("stream", ctypes.c_uint64), ("stats", ctypes.c_void_p)]


class QuantStats(ctypes.Structure):
    """Mirror of struct mxfp8_quant_stats (the statistics of one quantization; ``stats_dict`` turns it into the
    dict the public functions return)."""

    _c_name = "mxfp8_quant_stats"

    _fields_ = [(n, ctypes.c_int64) for n in ("elements", "groups", "saturated", "flushed_to_zero", "subnormal",
                                              "nonfinite_groups", "zero_groups")] + \
               [("scale_histogram", ctypes.c_int64 * 256), ("sum_sq_error", ctypes.c_double),
                ("sum_sq_signal", ctypes.c_double)]


def stats_dict(st):
    """The statistics of one quantization as a dict: elements, groups, saturated, flushed_to_zero, subnormal,
    nonfinite_groups, zero_groups (ints), scale_histogram (list of 256 ints, groups per E8M0 code), sum_sq_error,
    sum_sq_signal (floats, over the finite groups) and sqnr_db = 10 log10(sum_sq_signal / sum_sq_error) (inf when
    the error is 0, nan when nothing finite was quantized)."""
    d = {n: int(getattr(st, n)) for n in ("elements", "groups", "saturated", "flushed_to_zero", "subnormal",
                                          "nonfinite_groups", "zero_groups")}
    d["scale_histogram"] = [int(v) for v in st.scale_histogram]
    d["sum_sq_error"] = float(st.sum_sq_error)
    d["sum_sq_signal"] = float(st.sum_sq_signal)
    d["sqnr_db"] = float(function("mxfp8_quant_stats_sqnr_db")(ctypes.byref(st)))
    return d


def parse_seed(value, param="seed"):
    """A 64-bit seed or stream id: a non-negative int below 2**64 (TypeError / ValueError naming `param`)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{param}: expected an int, got {type(value).__name__}")
    v = int(value)
    if not 0 <= v < 1 << 64:
        raise ValueError(f"{param}: {v} is not in [0, 2**64)")
    return v


NUM_KERNEL_SLOTS = 3


class KernelInfo(ctypes.Structure):
    """Mirror of struct mxfp8_kernel_info."""

    _c_name = "mxfp8_kernel_info"

    _fields_ = [("slot", ctypes.c_char_p), ("kernel", ctypes.c_char_p), ("isa", ctypes.c_char_p),
                ("self_test", ctypes.c_int), ("note", ctypes.c_char_p)]


class Info(ctypes.Structure):
    """Mirror of struct mxfp8_info."""

    _c_name = "mxfp8_info"

    _fields_ = [
        ("has_avx512f", ctypes.c_int), ("has_avx512bw", ctypes.c_int), ("has_avx512vl", ctypes.c_int),
        ("has_avx512_bf16", ctypes.c_int), ("has_amx_tile", ctypes.c_int), ("has_amx_bf16", ctypes.c_int),
        ("amx_permitted", ctypes.c_int), ("isa", ctypes.c_int), ("isa_name", ctypes.c_char_p),
        ("isa_reason", ctypes.c_char_p), ("num_threads", ctypes.c_int),
        ("kernels", KernelInfo * NUM_KERNEL_SLOTS),
    ]


def as_array(x, allowed=None, name="x"):
    """numpy array of any array-like, checked against the dtype codes `allowed` (a tuple; None = any).

    Conversions, each done once here so that a call converts an input a single time:
      - Python numbers and lists of them become float32 (ints too, unless the parameter takes integer codes);
      - a float64 array (numpy's default dtype) becomes float32, rounded to nearest even, when the parameter takes
        float32 but not float64 -- the result is then exactly that of ``x.astype(np.float32)``.
    Any other dtype outside `allowed` raises TypeError naming the parameter and the accepted dtypes."""
    if isinstance(x, np.ndarray):
        arr = x
    else:
        arr = np.asarray(x)
        if not isinstance(x, np.generic) and (arr.dtype == np.float64 or arr.dtype.kind in "biu"):
            # Python numbers: floats (and ints, unless the parameter takes integer dtypes) become float32
            if arr.dtype.kind == "f" or allowed is None or not any(c in allowed for c in (I32, U8, U32)):
                arr = arr.astype(np.float32)
    if allowed is not None:
        if arr.dtype == np.float64 and F32 in allowed and F64 not in allowed:
            arr = arr.astype(np.float32)
        code = _CODE_OF_NP.get(arr.dtype)
        if code not in allowed:
            want = [str(np_dtype(c)) for c in allowed if c in _NP_OF_CODE]
            if F32 in allowed and F64 not in allowed:
                want.append("float64 (rounded to float32)")
            raise TypeError(f"{name}: dtype {arr.dtype} is not accepted (expected one of {', '.join(want)})")
    return arr


def view(arr, code=None, name="array"):
    """A Tensor view of numpy array `arr` (strides in elements, as numpy has them). `code` overrides the dtype
    code (e.g. E8M0 for a uint8 array of scale codes). The view keeps `arr` alive (view.array). `name` is the
    parameter named in a TypeError (dtype with no mxfp8 equivalent) or ValueError (rank above MAX_DIMS)."""
    arr = np.asarray(arr)
    if arr.ndim > MAX_DIMS:
        raise ValueError(f"{name}: rank {arr.ndim} exceeds the library's maximum rank {MAX_DIMS}")
    if code is None:
        try:
            code = dtype_code(arr.dtype)
        except TypeError:
            raise TypeError(f"{name}: dtype {arr.dtype} has no mxfp8 equivalent") from None
    item = arr.dtype.itemsize
    if any(s % item for s in arr.strides):
        arr = np.ascontiguousarray(arr)
    t = Tensor()
    t.data = arr.ctypes.data
    t.dtype = code
    t.ndim = arr.ndim
    for i in range(arr.ndim):
        t.shape[i] = arr.shape[i]
        t.strides[i] = arr.strides[i] // item
    t.array = arr
    return t


def none():
    """An absent optional tensor (MXFP8_TENSOR_NONE)."""
    return Tensor()


def empty(shape, code):
    """Uninitialized numpy output array of mxfp8 dtype `code`."""
    return np.empty(tuple(int(s) for s in shape), dtype=np_dtype(code))


def zeros(shape, code):
    """Zero-filled numpy output array of mxfp8 dtype `code`."""
    return np.zeros(tuple(int(s) for s in shape), dtype=np_dtype(code))


# ---- loading ----
_lock = threading.Lock()
_lib = None
_lib_path = None


def _candidates():
    env = os.environ.get("MXFP8_LIBRARY")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    out = [os.path.join(here, "libmxfp8.so")]
    repo = os.path.dirname(os.path.dirname(here))
    if os.path.isfile(os.path.join(repo, "include", "mxfp8.h")):
        out.append(os.path.join(repo, "build", "libmxfp8.so"))
    return out


_P = ctypes.c_void_p
_I = ctypes.c_int
_I64 = ctypes.c_int64
_SIGNATURES = {
    # name: (restype, argtypes)
    "mxfp8_version_number": (ctypes.c_uint, []),
    "mxfp8_version_string": (ctypes.c_char_p, []),
    "mxfp8_status_string": (ctypes.c_char_p, [_I]),
    "mxfp8_last_error_message": (ctypes.c_char_p, []),
    "mxfp8_dtype_size": (ctypes.c_size_t, [_I]),
    "mxfp8_enum_count": (ctypes.c_int32, [_I]),
    "mxfp8_enum_name": (ctypes.c_char_p, [_I, ctypes.c_int32]),
    "mxfp8_enum_alias": (ctypes.c_char_p, [_I, ctypes.c_int32, ctypes.c_int32]),
    "mxfp8_enum_what": (ctypes.c_char_p, [_I]),
    "mxfp8_enum_doc": (ctypes.c_char_p, [_I, ctypes.c_int32]),
    "mxfp8_enum_from_name": (_I, [_I, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int32)]),
    "mxfp8_dtype_name": (ctypes.c_char_p, [_I]),
    "mxfp8_tensor_numel": (_I64, [_P]),
    "mxfp8_fp32_to_fp8": (ctypes.c_uint8, [ctypes.c_float, _I]),
    "mxfp8_fp8_to_fp32": (ctypes.c_float, [ctypes.c_uint8, _I]),
    "mxfp8_e8m0_to_fp32": (ctypes.c_float, [ctypes.c_uint8]),
    "mxfp8_fp32_to_bf16": (ctypes.c_uint16, [ctypes.c_float]),
    "mxfp8_bf16_to_fp32": (ctypes.c_float, [ctypes.c_uint16]),
    "mxfp8_fp32_to_fp16": (ctypes.c_uint16, [ctypes.c_float]),
    "mxfp8_fp16_to_fp32": (ctypes.c_float, [ctypes.c_uint16]),
    "mxfp8_scale_code": (ctypes.c_uint8, [ctypes.c_float, _I, _I]),
    "mxfp8_quantize": (_I, [_P, _I, _P, _P, _P]),
    "mxfp8_quant_stats_sqnr_db": (ctypes.c_double, [_P]),
    "mxfp8_dequantize": (_I, [_P, _P, _I, _I, _P]),
    "mxfp8_scale_layout_shape": (_I, [_I, _I64, _I64, _P]),
    "mxfp8_scales_to_layout": (_I, [_P, _I64, _I, _P]),
    "mxfp8_scales_from_layout": (_I, [_P, _I64, _I, _P]),
    "mxfp8_pack_x4": (_I, [_P, _I, _P]),
    "mxfp8_unpack_x4": (_I, [_P, _I, _P]),
    "mxfp8_swizzle_nki": (_I, [_P, _P]),
    "mxfp8_unswizzle_nki": (_I, [_P, _P]),
    "mxfp8_set_num_threads": (_I, [_I]),
    "mxfp8_get_info": (_I, [_P]),
    "mxfp8_cpu_feature_count": (_I, []),
    "mxfp8_cpu_feature": (_I, [_I, _P, _P]),
    "mxfp8_matmul_config_init": (None, [_P]),
    "mxfp8_gemm": (_I, [_P, _P, _P, _I, _P]),
    "mxfp8_matmul": (_I, [_P, _P, _P, _P]),
    "mxfp8_linear": (_I, [_P, _P, _P, _P, _P]),
    "mxfp8_matmul_bwd_args_init": (None, [_P]),
    "mxfp8_matmul_backward": (_I, [_P, _P, _P]),
    "mxfp8_bias_grad": (_I, [_P, _P]),
    "mxfp8_router_linear": (_I, [_P, _P, _P, _P, _P]),
    "mxfp8_router_linear_input_grad": (_I, [_P, _P, _I, _P, _P]),
    "mxfp8_router_linear_weight_grad": (_I, [_P, _P, _I, _P, _P]),
    "mxfp8_gemm_golden_unquantized": (_I, [_P, _P, _I, _P]),
    "mxfp8_gemm_golden_quantized": (_I, [_P, _P, _P, _P]),
    "mxfp8_compare": (_I, [_P, _P, ctypes.c_double, ctypes.c_double, _P]),
    "mxfp8_moe_num_blocks": (_I, [_I64, _I64, _I64, _I64, _P]),
    "mxfp8_moe_route": (_I, [_P, _P, _I64, _I64, ctypes.c_int32, _P, _P, _P]),
    "mxfp8_moe_config_init": (None, [_P]),
    "mxfp8_moe_forward": (_I, [_P, _P]),
    "mxfp8_moe_backward": (_I, [_P, _P]),
    "mxfp8_workspace_create": (_I, [_P]),
    "mxfp8_workspace_destroy": (None, [ctypes.c_void_p]),
    "mxfp8_workspace_bytes": (ctypes.c_size_t, [ctypes.c_void_p]),
    "mxfp8_workspace_reserve": (_I, [ctypes.c_void_p, ctypes.c_size_t]),
    # the validate-and-size entries: the call's checks (same status and message), nothing written; the last
    # argument receives the workspace bytes the call takes (size_t *, may be NULL)
    "mxfp8_quantize_validate": (_I, [_P, _I, _P, _P, _P, _P]),
    "mxfp8_dequantize_validate": (_I, [_P, _P, _I, _I, _P, _P]),
    "mxfp8_gemm_validate": (_I, [_P, _P, _P, _I, _P, _P]),
    "mxfp8_matmul_validate": (_I, [_P, _P, _P, _P, _P]),
    "mxfp8_linear_validate": (_I, [_P, _P, _P, _P, _P, _P]),
    "mxfp8_matmul_backward_validate": (_I, [_P, _P, _P, _P]),
    "mxfp8_moe_route_validate": (_I, [_P, _P, _I64, _I64, ctypes.c_int32, _P, _P, _P, _P]),
    "mxfp8_moe_forward_validate": (_I, [_P, _P, _P]),
    "mxfp8_moe_backward_validate": (_I, [_P, _P, _P]),
}


def _declare_all(cdll):
    for name, (res, args) in _SIGNATURES.items():
        fn = getattr(cdll, name, None)
        if fn is not None:
            fn.restype = res
            fn.argtypes = args


def lib():
    """The loaded libmxfp8 (ctypes.CDLL), loaded once. OSError naming the paths tried if none loads."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            errors = []
            for path in _candidates():
                if not os.path.isfile(path):
                    errors.append(f"{path}: not found")
                    continue
                try:
                    cdll = ctypes.CDLL(path)
                except OSError as e:
                    errors.append(f"{path}: {e}")
                    continue
                _declare_all(cdll)
                _lib_path = path
                _lib = cdll
                break
            else:
                raise OSError("mxfp8: cannot load libmxfp8.so (set MXFP8_LIBRARY to its path): " + "; ".join(errors))
    return _lib


def library_path():
    """Path of the loaded shared library."""
    lib()
    return _lib_path


def declare(name, restype, argtypes):
    """Declare the C signature of `name` (for functions not in _SIGNATURES)."""
    _SIGNATURES[name] = (restype, list(argtypes))
    fn = function(name)
    fn.restype = restype
    fn.argtypes = list(argtypes)


def has(name):
    """True if the loaded library exports `name`."""
    return getattr(lib(), name, None) is not None


def function(name):
    """The ctypes function `name`; MXFP8Error(UNSUPPORTED) if this build of the library lacks it."""
    fn = getattr(lib(), name, None)
    if fn is None:
        raise MXFP8Error(ERR_UNSUPPORTED, f"{name} is not available in {library_path()}")
    return fn


def last_error_message():
    msg = function("mxfp8_last_error_message")()
    return msg.decode("utf-8", "replace") if msg else ""


def check(status):
    """Raise MXFP8Error for a non-zero status (message from mxfp8_last_error_message on this thread)."""
    if status != OK:
        raise MXFP8Error(status, last_error_message())


# C entry points an observer (mxfp8.telemetry's statistics collector) sees; filled by that module.
OBSERVED_CALLS = {}


def set_observer(obs):
    """Make `obs` (an object with _observe(name, args, run), or None) observe this thread's OBSERVED_CALLS; returns
    the previous observer."""
    prev = getattr(_tls, "observer", None)
    _tls.observer = obs
    return prev


def call(name, *args):
    """Call C function `name` returning mxfp8_status; raise MXFP8Error on failure. Returns None."""
    obs = getattr(_tls, "observer", None)
    if obs is not None and name in OBSERVED_CALLS:
        obs._observe(name, args, lambda: check(function(name)(*args)))
        return
    check(function(name)(*args))


def ref(x):
    """ctypes.byref(x) (shorthand for passing a view or struct)."""
    return ctypes.byref(x)


# ---- scratch memory: one library workspace per Python thread ----
class _Workspace:
    """Owns one mxfp8_workspace (the library's reusable scratch memory); freed with the object."""

    def __init__(self):
        h = ctypes.c_void_p()
        call("mxfp8_workspace_create", ctypes.byref(h))
        self.handle = h.value
        self._destroy = function("mxfp8_workspace_destroy")

    def __del__(self):
        if getattr(self, "handle", None):
            self._destroy(self.handle)
            self.handle = None


_tls = threading.local()


def workspace():
    """The calling thread's workspace handle (a void pointer value), created on first use: repeated calls of the
    GEMM, matmul, router and MoE functions on one thread then reuse their scratch memory instead of allocating it."""
    ws = getattr(_tls, "ws", None)
    if ws is None:
        ws = _tls.ws = _Workspace()
    return ws.handle


def workspace_bytes():
    """Bytes held by the calling thread's workspace (0 before its first use)."""
    ws = getattr(_tls, "ws", None)
    return int(function("mxfp8_workspace_bytes")(ws.handle)) if ws is not None else 0


def release_workspace():
    """Free the calling thread's workspace; the next call that wants one creates it anew."""
    _tls.ws = None
