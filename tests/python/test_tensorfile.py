"""mxfp8.load / mxfp8.save: round trips of every dtype (.safetensors and .npy), cross-checks with the `safetensors`
package (its Rust reader validates and decodes what we write; what it writes, we read) and with the `mxfp8` command
(files of one are read by the other), content-based format detection, malformed files, atomic writes.
"""

import json
import os
import struct
import subprocess

import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy

import mx_oracle
import mxfp8
from build_paths import CLI, require

DTYPES = {  # safetensors name: numpy / ml_dtypes dtype
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2, "F8_E8M0": ml_dtypes.float8_e8m0fnu,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U64": np.uint64, "U32": np.uint32,
    "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
}


def sample(rng, dt, shape):
    return np.asarray(_sample(rng, np.dtype(dt), shape))


def _sample(rng, dt, shape):
    if dt == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
    if dt == np.dtype(ml_dtypes.float8_e8m0fnu):
        return rng.integers(0, 256, shape).astype(np.uint8).view(dt)
    if dt.itemsize == 1:  # every FP8 code, NaN included
        return rng.integers(0, 256, shape).astype(np.uint8).view(dt)
    return (rng.standard_normal(shape) * 100).astype(dt)


def bits(a):
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def assert_same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
    np.testing.assert_array_equal(bits(a), bits(b))


def tensors_of_every_dtype(rng):
    shapes = [(3, 5), (7,), (), (2, 0, 3), (1, 2, 3, 4)]
    return {f"t_{name}": sample(rng, dt, shapes[i % len(shapes)]) for i, (name, dt) in enumerate(DTYPES.items())}


def test_round_trip_every_dtype(tmp_path, rng):
    t = tensors_of_every_dtype(rng)
    t["strided"] = sample(rng, np.float32, (6, 8))[::2, ::-3]      # written row-major
    t["big_endian"] = sample(rng, np.float32, (4,)).astype(">f4")  # written little-endian
    mxfp8.save(tmp_path / "a.safetensors", t, metadata={"note": "x"})
    got, meta = mxfp8.load(tmp_path / "a.safetensors", with_metadata=True)
    assert list(got) == list(t) and meta == {"producer": "mxfp8", "note": "x"}
    for k in t:
        want = t[k].astype(t[k].dtype.newbyteorder("="), order="C")
        assert_same(got[k], want)
        assert got[k].flags.writeable and got[k].flags.aligned and got[k].flags.c_contiguous
    assert os.listdir(tmp_path) == ["a.safetensors"]


def test_npy_round_trip_and_naming(tmp_path, rng):
    for name, dt in DTYPES.items():
        x = sample(rng, dt, (4, 6))
        if name in ("BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0"):
            with pytest.raises(ValueError, match="use .safetensors"):
                mxfp8.save(tmp_path / "x.npy", {"x": x})
            continue
        mxfp8.save(tmp_path / "x.npy", {"anything": x})
        got = mxfp8.load(tmp_path / "x.npy")
        assert list(got) == ["x"]  # named by the file's stem
        assert_same(got["x"], x)
        assert_same(np.load(tmp_path / "x.npy"), x)  # numpy's own reader
    assert os.listdir(tmp_path) == ["x.npy"]
    with pytest.raises(ValueError, match="exactly one"):
        mxfp8.save(tmp_path / "y.npy", {"a": np.zeros(2), "b": np.zeros(2)})
    # numpy's writer, Fortran order and big-endian included
    np.save(tmp_path / "f.npy", np.asfortranarray(np.arange(12.0).reshape(3, 4)))
    np.save(tmp_path / "b.npy", np.arange(5, dtype=">i4"))
    np.testing.assert_array_equal(mxfp8.load(tmp_path / "f.npy")["f"], np.arange(12.0).reshape(3, 4))
    b = mxfp8.load(tmp_path / "b.npy")["b"]
    assert b.dtype == np.int32 and b.dtype.isnative and b.tolist() == list(range(5))


def test_quantize_outputs_round_trip(tmp_path, rng):
    x = rng.standard_normal((8, 96)).astype(np.float32)
    data, scales = mxfp8.quantize(x, fmt="e5m2")
    mxfp8.save(tmp_path / "q.safetensors", {"data": data, "scales": scales})
    got = mxfp8.load(tmp_path / "q.safetensors")
    assert_same(got["data"], data)
    assert_same(got["scales"], scales)
    np.testing.assert_array_equal(mxfp8.dequantize(got["data"], got["scales"]), mxfp8.dequantize(data, scales))


def test_safetensors_package_reads_what_we_write(tmp_path, rng):
    """The reference reader (Rust) validates our files and decodes every tensor to the same bytes; its numpy loader
    reads the dtypes it knows (not BF16 / F8, as the module doc says)."""
    t = tensors_of_every_dtype(rng)
    mxfp8.save(tmp_path / "a.safetensors", t)
    raw = (tmp_path / "a.safetensors").read_bytes()
    ref = dict(safetensors.deserialize(raw))
    assert set(ref) == set(t)
    for k, x in t.items():
        assert ref[k]["dtype"] == k[2:] and list(ref[k]["shape"]) == list(x.shape)
        arr = np.frombuffer(bytes(ref[k]["data"]), DTYPES[k[2:]]).reshape(ref[k]["shape"])  # the recipe of the doc
        assert_same(arr, x)
    numpy_kinds = {k: x for k, x in t.items() if k[2:] not in ("BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "U16")}
    mxfp8.save(tmp_path / "n.safetensors", numpy_kinds)
    loaded = safetensors.numpy.load_file(str(tmp_path / "n.safetensors"))
    for k, x in numpy_kinds.items():
        assert_same(loaded[k], x)
    with pytest.raises(Exception):  # the limitation the module doc states
        safetensors.numpy.load_file(str(tmp_path / "a.safetensors"))


def test_we_read_what_the_safetensors_package_writes(tmp_path, rng):
    t = {"f32": sample(rng, np.float32, (5, 7)), "f16": sample(rng, np.float16, (3,)),
         "f64": sample(rng, np.float64, ()), "i64": sample(rng, np.int64, (2, 2)), "u8": sample(rng, np.uint8, (9,)),
         "b": sample(rng, np.bool_, (4,)), "empty": np.zeros((0, 3), np.float32)}
    safetensors.numpy.save_file(t, str(tmp_path / "r.safetensors"), metadata={"format": "np"})
    got, meta = mxfp8.load(tmp_path / "r.safetensors", with_metadata=True)
    assert meta == {"format": "np"} and set(got) == set(t)
    for k in t:
        assert_same(got[k], t[k])
    # BF16 / FP8 / E8M0: the reference writes them from ml_dtypes arrays (it names dtypes by dtype.name)
    t = {k: sample(rng, DTYPES[k], (3, 4)) for k in ("BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0")}
    safetensors.numpy.save_file(t, str(tmp_path / "s.safetensors"))
    got = mxfp8.load(tmp_path / "s.safetensors")
    for k in t:
        assert_same(got[k], t[k])


def test_cli_reads_what_we_write_and_we_read_what_it_writes(tmp_path, rng):
    require(CLI)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    mxfp8.save(tmp_path / "x.safetensors", {"x": x.astype(ml_dtypes.bfloat16)})
    r = subprocess.run([CLI, "quantize", str(tmp_path / "x.safetensors"), "-o", str(tmp_path / "q.safetensors"),
                        "--fmt", "e5m2"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = mxfp8.load(tmp_path / "q.safetensors")
    data, scales = mxfp8.quantize(x.astype(ml_dtypes.bfloat16), fmt="e5m2")
    assert_same(got["data"], data)
    assert_same(got["scales"], scales)
    mxfp8.save(tmp_path / "q2.safetensors", {"data": data, "scales": scales.view(ml_dtypes.float8_e8m0fnu)})
    r = subprocess.run([CLI, "dequantize", str(tmp_path / "q2.safetensors"), "-o", str(tmp_path / "y.npy")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(mxfp8.load(tmp_path / "y.npy")["y"], mxfp8.dequantize(data, scales))


def test_format_detected_by_content(tmp_path, rng):
    x = sample(rng, np.float32, (3, 4))
    mxfp8.save(tmp_path / "a.npy", {"a": x})
    os.rename(tmp_path / "a.npy", tmp_path / "a.txt")
    assert_same(mxfp8.load(tmp_path / "a.txt")["a"], x)
    mxfp8.save(tmp_path / "b.safetensors", {"b": x})
    os.rename(tmp_path / "b.safetensors", tmp_path / "b.npy")
    assert_same(mxfp8.load(tmp_path / "b.npy")["b"], x)
    (tmp_path / "c.txt").write_text("hello, this is not a tensor file\n")
    with pytest.raises(ValueError, match=r"c\.txt: not a \.npy file .* nor a safetensors file"):
        mxfp8.load(tmp_path / "c.txt")


def _st(header, data=b"", raw_header=None):
    h = raw_header if raw_header is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


@pytest.mark.parametrize("case,blob,words", [
    ("truncated_length", b"\x01\x00", "too short"),
    ("header_past_eof", struct.pack("<Q", 400) + b"{}", "past the end"),
    ("header_above_100MB", struct.pack("<Q", 200_000_000) + b"{}" * 10, "above 100 MB"),
    ("not_json", _st(None, raw_header=b"{nope"), "not valid JSON"),
    ("not_utf8", _st(None, raw_header=b'{"\xff": 1}'), "UTF-8"),
    ("duplicate", _st(None, b"\0" * 8, raw_header=b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},'
                                              b' "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}'),
     "duplicate entry 'a'"),
    ("unknown_dtype", _st({"a": {"dtype": "F12", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
     "unknown dtype 'F12'"),
    ("bytes_vs_shape", _st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4), "needs 8"),
    ("negative_dim", _st({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4),
     "non-negative"),
    ("reversed", _st({"a": {"dtype": "U8", "shape": [0], "data_offsets": [4, 0]}}, b"\0" * 4), "begin <= end"),
    ("overlap", _st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                     "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}, b"\0" * 6), "overlaps"),
    ("gap", _st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8), "gap"),
    ("truncated_data", _st({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8),
     "truncated"),
    ("bad_metadata", _st({"__metadata__": {"k": 1}}), "__metadata__"),
    ("extra_key", _st({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "x": 0}}, b"\0"),
     "exactly the keys"),
    ("bad_npy", b"\x93NUMPY\x01\x00\x10\x00{'descr': '<f4'", "not a valid .npy file"),
])
def test_malformed_files_rejected(tmp_path, case, blob, words):
    (tmp_path / "bad.safetensors").write_bytes(blob)
    with pytest.raises(ValueError) as e:
        mxfp8.load(tmp_path / "bad.safetensors")
    msg = str(e.value)
    assert msg.startswith(str(tmp_path / "bad.safetensors") + ": ") and words in msg, msg
    if case not in ("bad_npy", "bad_metadata", "extra_key"):  # where the reference has an opinion, it agrees
        with pytest.raises(Exception):
            safetensors.deserialize(blob)


def test_save_errors_leave_nothing(tmp_path):
    with pytest.raises(TypeError, match="complex128"):
        mxfp8.save(tmp_path / "a.safetensors", {"ok": np.zeros(3), "c": np.zeros(2, complex)})
    with pytest.raises(ValueError, match="tensor name"):
        mxfp8.save(tmp_path / "a.safetensors", {"__metadata__": np.zeros(3)})
    with pytest.raises(TypeError, match="mapping"):
        mxfp8.save(tmp_path / "a.safetensors", np.zeros(3))
    with pytest.raises(ValueError, match="metadata"):
        mxfp8.save(tmp_path / "a.safetensors", {"a": np.zeros(3)}, metadata={"k": 1})
    assert os.listdir(tmp_path) == []
    with pytest.raises(OSError):
        mxfp8.save(tmp_path / "missing_dir" / "a.safetensors", {"a": np.zeros(3)})
    mxfp8.save(tmp_path / "a.safetensors", {"a": np.ones(3)})
    before = (tmp_path / "a.safetensors").read_bytes()
    with pytest.raises(TypeError):  # a failed save keeps the old file whole
        mxfp8.save(tmp_path / "a.safetensors", {"a": np.ones(3), "o": np.array([object()])})
    assert (tmp_path / "a.safetensors").read_bytes() == before and os.listdir(tmp_path) == ["a.safetensors"]


def _cut_cases():
    """A valid two-tensor file (a: F32 [3] at [0, 12], b: U8 [5] at [12, 17]) and a one-value one, each cut by 1 to 16
    bytes at its end, with the exact message the CLI's reader must give for each cut: a cut inside the data names
    the tensor that runs past the end and how many data bytes are left; a cut into the header names its length and
    the file's size."""
    two = _st({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},
               "b": {"dtype": "U8", "shape": [5], "data_offsets": [12, 17]}}, bytes(range(17)))
    one = _st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, struct.pack("<f", 1.5))
    cases = []
    for name, blob, ents in (("two", two, [("a", 0, 12), ("b", 12, 17)]), ("one", one, [("a", 0, 4)])):
        hlen = struct.unpack("<Q", blob[:8])[0]
        data_len = len(blob) - 8 - hlen
        for cut in range(1, 17):
            size, left = len(blob) - cut, data_len - cut
            if left >= 0:
                t, b, e = next(x for x in ents if x[2] > left)  # the first tensor (by offset) past the end
                msg = f"tensor '{t}': data_offsets [{b}, {e}] run past the end of the data ({left} bytes; truncated file?)"
            else:
                msg = f"safetensors header length {hlen} runs past the end of the file ({size} bytes)"
            cases.append((name, blob, cut, msg))
    return cases


@pytest.mark.parametrize("name,blob,cut,msg", _cut_cases(), ids=lambda v: v if isinstance(v, (str, int)) else "")
def test_every_cut_of_a_valid_file(tmp_path, name, blob, cut, msg):
    """Every cut of 1 to 16 bytes: exit 2 with exactly the message of that cut (a bounds check off by one byte
    changes the message: another check then answers), nothing written; the uncut file reads."""
    require(CLI)
    (tmp_path / "ok.safetensors").write_bytes(blob)
    r = subprocess.run([CLI, "quantize", tmp_path / "ok.safetensors", "--tensor", "a", "-o", tmp_path / "q.safetensors"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    path = tmp_path / "cut.safetensors"
    path.write_bytes(blob[:-cut])
    r = subprocess.run([CLI, "quantize", path, "--tensor", "a", "-o", tmp_path / "o.safetensors"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and r.stderr == f"mxfp8 quantize: error: {path}: {msg}\n", r.stderr
    assert not (tmp_path / "o.safetensors").exists()
    with pytest.raises(ValueError, match=r"truncated|past the end"):  # the Python reader refuses every cut too
        mxfp8.load(path)


def test_saved_quantized_files_describe_themselves(tmp_path, rng):
    """mxfp8.save with mxfp8.quantization_metadata: mxfp8.load returns the description, and the CLI's dequantize
    takes its group scheme and axis (wrapX along axis 0 here; dequantizing with the CLI's defaults, 1x32 along the
    axis where the shapes differ, would be wrong) and refuses a contradicting --group."""
    require(CLI)
    x = rng.standard_normal((256, 64)).astype(np.float32)
    data, scales = mxfp8.quantize(x, fmt="e5m2", axis=0, group="wrapx", scale_rule="ocp")
    meta = mxfp8.quantization_metadata(x.ndim, fmt="e5m2", axis=-2, group="wrapX", scale_rule="OCP")
    assert meta == {"mx.format": "e5m2", "mx.scale_rule": "ocp", "mx.group": "wrapx", "mx.axis": "0",
                    "mx.scale_layout": "compact", "mx.rounding": "nearest"}
    mxfp8.save(tmp_path / "q.safetensors", {"data": data, "scales": scales}, metadata=meta)
    t, m = mxfp8.load(tmp_path / "q.safetensors", with_metadata=True)
    assert m == {"producer": "mxfp8", **meta}
    r = subprocess.run([CLI, "dequantize", tmp_path / "q.safetensors", "-o", tmp_path / "d.npy"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    want = mx_oracle.dequantize(*mx_oracle.quantize(x, fmt="e5m2", axis=0, rule="ocp", group="wrapx"), fmt="e5m2",
                                axis=0, group="wrapx")
    np.testing.assert_array_equal(np.load(tmp_path / "d.npy"), want)
    r = subprocess.run([CLI, "dequantize", tmp_path / "q.safetensors", "-o", tmp_path / "e.npy", "--group", "1x32"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "contradicts" in r.stderr and not (tmp_path / "e.npy").exists(), r.stderr
    with pytest.raises(ValueError, match="group"):
        mxfp8.quantization_metadata(2, group="wrap")
    with pytest.raises(ValueError, match="axis"):
        mxfp8.quantization_metadata(2, axis=2)
