"""Tensor files: mxfp8.load(path) and mxfp8.save(path, tensors) for .safetensors and .npy files, with numpy and
ml_dtypes dtypes (bfloat16, FP8 E4M3 / E5M2 and E8M0 included) -- the files the `mxfp8` command reads and writes.

Formats
    .safetensors: an 8-byte little-endian header length n, a JSON header of n bytes ({name: {"dtype", "shape",
    "data_offsets": [begin, end]}, optional "__metadata__": {str: str}}), then the data buffer (row-major,
    little-endian); https://github.com/huggingface/safetensors. dtypes and their arrays:
        F64 float64, F32 float32, F16 float16, BF16 ml_dtypes.bfloat16, F8_E4M3 ml_dtypes.float8_e4m3fn,
        F8_E5M2 ml_dtypes.float8_e5m2, F8_E8M0 ml_dtypes.float8_e8m0fnu, I64 int64, I32 int32, I16 int16,
        I8 int8, U64 uint64, U32 uint32, U16 uint16, U8 uint8, BOOL bool.
    .npy: numpy's format (one array), for the dtypes numpy itself knows (not bfloat16 / FP8 / E8M0, which numpy would
    store as raw bytes: save those as .safetensors).
`mxfp8 quantize` writes `data` (F8_E4M3 / F8_E5M2) and `scales` (U8 E8M0 codes); mxfp8.quantize returns the same
arrays, so ``mxfp8.save("q.safetensors", {"data": data, "scales": scales})`` writes the file the command writes.

Reading our files with the `safetensors` package
    safetensors.numpy.load_file / safe_open(..., framework="numpy") know only numpy's own dtypes, so they read
    F32 / F16 / F64 / integer tensors but fail on BF16 and F8 ones. The package's format-level reader works for every
    dtype, and ml_dtypes gives the arrays:

        import ml_dtypes, numpy as np, safetensors
        NP = {"BF16": ml_dtypes.bfloat16, "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
              "F8_E8M0": ml_dtypes.float8_e8m0fnu, "F32": np.float32, "F16": np.float16, "U8": np.uint8}
        with open("q.safetensors", "rb") as f:
            tensors = {name: np.frombuffer(t["data"], NP[t["dtype"]]).reshape(t["shape"])
                       for name, t in safetensors.deserialize(f.read())}

    With PyTorch, safetensors.torch.load_file reads BF16, F8_E4M3 and F8_E5M2 (torch.float8_e4m3fn /
    torch.float8_e5m2) directly.
"""

import json
import os
import secrets

import ml_dtypes
import numpy as np

__all__ = ["load", "save"]

MAX_HEADER = 100 * 1000 * 1000  # bytes; the limit of the safetensors reference implementation
_NPY_MAGIC = b"\x93NUMPY"

_ST_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2, "I64": np.int64, "I32": np.int32,
    "I16": np.int16, "I8": np.int8, "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8,
    "BOOL": np.bool_,
}
if hasattr(ml_dtypes, "float8_e8m0fnu"):
    _ST_DTYPES["F8_E8M0"] = ml_dtypes.float8_e8m0fnu
_ST_DTYPES = {k: np.dtype(v) for k, v in _ST_DTYPES.items()}
_ST_NAME = {v: k for k, v in _ST_DTYPES.items()}
_NOT_NPY = {np.dtype(d) for d in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2)} | \
    ({np.dtype(ml_dtypes.float8_e8m0fnu)} if hasattr(ml_dtypes, "float8_e8m0fnu") else set())


def _fail(path, msg):
    raise ValueError(f"{path}: {msg}")


class _Duplicate(ValueError):
    pass


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise _Duplicate(k)
        out[k] = v
    return out


def _entries(path, header, data_len):
    """Validate a parsed safetensors header; returns [(name, dtype, shape, begin, end)] and the metadata."""
    if not isinstance(header, dict):
        _fail(path, "the safetensors header is not a JSON object")
    meta = header.pop("__metadata__", None)
    if meta is not None and (not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values())):
        _fail(path, "'__metadata__' must map names to strings")
    out = []
    for name, e in header.items():
        if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
            _fail(path, f"tensor {name!r}: expected exactly the keys dtype, shape, data_offsets")
        dt = _ST_DTYPES.get(e["dtype"]) if isinstance(e["dtype"], str) else None
        if dt is None:
            _fail(path, f"tensor {name!r}: unknown dtype {e['dtype']!r} (known: {', '.join(_ST_DTYPES)})")
        shape, offs = e["shape"], e["data_offsets"]
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            _fail(path, f"tensor {name!r}: shape {shape!r} is not a list of non-negative integers")
        if not (isinstance(offs, list) and len(offs) == 2 and all(type(o) is int for o in offs)
                and 0 <= offs[0] <= offs[1]):
            _fail(path, f"tensor {name!r}: data_offsets {offs!r} is not [begin, end] with 0 <= begin <= end")
        need = int(np.prod(shape, dtype=object)) * dt.itemsize
        if offs[1] - offs[0] != need:
            _fail(path, f"tensor {name!r}: {dt} {shape} needs {need} bytes, data_offsets span {offs[1] - offs[0]}")
        out.append((name, dt, tuple(shape), offs[0], offs[1]))
    pos = 0
    for name, _, _, b, e in sorted(out, key=lambda t: (t[3], t[4])):
        if b != pos:
            what = "overlaps the previous tensor" if b < pos else f"leaves a gap at byte {pos}"
            _fail(path, f"tensor {name!r}: data range [{b}, {e}) {what} (ranges must tile the data buffer)")
        pos = e
    if pos != data_len:
        _fail(path, f"the data buffer holds {data_len} bytes but the tensors cover {pos}"
              + (" (truncated file)" if pos > data_len else ""))
    return out, dict(meta or {})


def _load_safetensors(path, f, size):
    head = f.read(8)
    if len(head) < 8:
        _fail(path, f"truncated: {size} bytes, too short for a .npy or safetensors file")
    n = int.from_bytes(head, "little")
    if n > MAX_HEADER or 8 + n > size:
        _fail(path, "not a .npy file (no \\x93NUMPY magic) nor a safetensors file: the first 8 bytes give a header "
              f"length of {n} bytes, " + ("above 100 MB" if n > MAX_HEADER else f"past the end of the {size}-byte file"))
    raw = f.read(n)
    if not raw.lstrip(b" ").startswith(b"{"):
        _fail(path, "not a .npy file (no \\x93NUMPY magic) nor a safetensors file (its header is not a JSON object)")
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError:
        _fail(path, "the safetensors header is not valid UTF-8")
    except _Duplicate as e:
        _fail(path, f"duplicate entry {e.args[0]!r} in the safetensors header")
    except ValueError as e:
        _fail(path, f"the safetensors header is not valid JSON: {e}")
    entries, meta = _entries(path, header, size - 8 - n)
    tensors = {}
    for name, dt, shape, b, e in sorted(entries, key=lambda t: t[3]):
        arr = np.empty(shape, dt)  # aligned, writable, owns its memory
        f.seek(8 + n + b)
        if e > b and f.readinto(memoryview(arr.reshape(-1).view(np.uint8))) != e - b:
            _fail(path, f"tensor {name!r}: truncated")
        tensors[name] = arr
    return {name: tensors[name] for name, *_ in entries}, meta  # header order


def _load_npy(path, f):
    try:
        arr = np.load(f, allow_pickle=False)
    except ValueError as e:
        _fail(path, f"not a valid .npy file: {e}")
    if arr.dtype.kind == "V" or arr.dtype.hasobject:
        _fail(path, f".npy dtype {arr.dtype.str!r} is not numeric (bfloat16 / FP8 arrays are stored in .safetensors)")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return {os.path.splitext(os.path.basename(path))[0]: arr}, {}


def load(path, with_metadata=False):
    """Read every tensor of a .safetensors or .npy file.

    The format is detected from the file's content (the .npy magic bytes \\x93NUMPY, else safetensors), not from
    its name. A .npy array is named by the file's stem ("x" for x.npy). Every size in a safetensors header is
    checked against the file before it is used: unknown dtypes, truncated data, header lengths past the end or above
    100 MB, overlapping / gapped / out-of-range data_offsets, byte counts that differ from shape x dtype and
    duplicate names are errors.

    Parameters
    ----------
    path : str or os.PathLike
    with_metadata : bool
        Also return the safetensors "__metadata__" dict ({str: str}; {} for .npy).

    Returns
    -------
    {name: numpy array} in file order (writable, aligned, native byte order; dtypes as in the module doc), or
    (tensors, metadata) with with_metadata=True.

    Raises
    ------
    ValueError naming the file and the problem for a malformed file; OSError when it cannot be read.

    Without mxfp8: help(mxfp8.tensorfile) shows how to read these files with the safetensors package and ml_dtypes
    (safetensors.numpy.load_file alone cannot read BF16 / FP8 tensors).
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        is_npy = f.read(len(_NPY_MAGIC)) == _NPY_MAGIC
        f.seek(0)
        tensors, meta = _load_npy(path, f) if is_npy else _load_safetensors(path, f, size)
    return (tensors, meta) if with_metadata else tensors


def _prepare(path, tensors):
    if not hasattr(tensors, "items"):
        raise TypeError(f"tensors: expected a mapping of names to arrays, got {type(tensors).__name__}")
    out = {}
    for name, a in tensors.items():
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise ValueError(f"tensors: invalid tensor name {name!r}")
        arr = np.asarray(a)
        if not arr.dtype.isnative:
            arr = arr.astype(arr.dtype.newbyteorder("="))
        out[name] = arr if arr.flags.c_contiguous else arr.copy(order="C")  # (ascontiguousarray makes 0-d 1-d)
    return out


def _safetensors_bytes(tensors, metadata):
    header = {"__metadata__": {"producer": "mxfp8", **metadata}}
    off = 0
    for name, arr in tensors.items():
        code = _ST_NAME.get(arr.dtype)
        if code is None:
            raise TypeError(f"tensors[{name!r}]: dtype {arr.dtype} has no safetensors name (known: "
                            f"{', '.join(str(d) for d in _ST_NAME)})")
        header[name] = {"dtype": code, "shape": list(arr.shape), "data_offsets": [off, off + arr.nbytes]}
        off += arr.nbytes
    h = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    h += b" " * (-len(h) % 8)  # keep the data buffer 8-byte aligned, as the reference implementation does
    return len(h).to_bytes(8, "little") + h


def save(path, tensors, metadata=None):
    """Write named arrays to a .safetensors file, or one array to a .npy file, atomically.

    The format follows the file name: ".npy" writes numpy's format (exactly one tensor, of a dtype numpy itself
    knows: not bfloat16 / FP8 / E8M0); any other name writes safetensors. The bytes go to a temporary file in the
    destination's directory, which is flushed to disk and renamed over `path`: a failed save leaves neither a
    partial file nor a stray one.

    Parameters
    ----------
    path : str or os.PathLike
    tensors : {name: array_like}
        Any shapes; dtypes as in the module doc (FP8 codes as ml_dtypes.float8_e4m3fn / float8_e5m2 arrays, E8M0
        scales as uint8 codes -- written as U8, as `mxfp8 quantize` does -- or ml_dtypes.float8_e8m0fnu, written as
        F8_E8M0). Non-contiguous and big-endian arrays are written row-major, little-endian.
    metadata : {str: str} or None
        safetensors "__metadata__" entries (with "producer": "mxfp8"); not allowed for .npy. For quantized
        tensors, mxfp8.quantization_metadata(...) gives the entries that make the file describe itself to the
        ``mxfp8 dequantize`` / ``mxfp8 diff`` commands.

    Raises
    ------
    TypeError (a dtype without a file name, tensors not a mapping), ValueError (names, .npy with other than one
    tensor or a non-numpy dtype, bad metadata), OSError (the directory cannot be written).
    """
    path = os.fspath(path)
    tensors = _prepare(path, tensors)
    npy = path.lower().endswith(".npy")
    if metadata is not None and (npy or not isinstance(metadata, dict) or
                                 not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise ValueError("metadata: expected {str: str} (and a .safetensors file)")
    if npy:
        if len(tensors) != 1:
            raise ValueError(f"{path}: a .npy file holds exactly one array, got {len(tensors)}")
        arr = next(iter(tensors.values()))
        if arr.dtype in _NOT_NPY or arr.dtype.kind == "V" or arr.dtype.hasobject:
            raise ValueError(f"{path}: .npy cannot hold {arr.dtype} (numpy would store raw bytes); use .safetensors")
    else:
        head = _safetensors_bytes(tensors, metadata or {})
    d, base = os.path.split(os.path.abspath(path))
    tmp = os.path.join(d, f".{base}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as for a plain open()
    except OSError as e:  # said of the caller's path, not of the temporary file's name
        why = "does not exist" if not os.path.isdir(d) else "cannot be written"
        raise type(e)(e.errno, f"{path}: cannot write: the directory {d} {why} ({e.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            if npy:
                np.save(f, arr, allow_pickle=False)
            else:
                f.write(head)
                for arr in tensors.values():
                    f.write(memoryview(arr.reshape(-1).view(np.uint8)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
