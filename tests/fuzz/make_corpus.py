#!/usr/bin/env python3
"""Write the seed corpus of the libFuzzer targets (tests/fuzz/corpus/<target>/), small files: valid files of each
dtype and rank plus one of each malformed case the readers must reject. Deterministic; stdlib only.
Run from anywhere: python3 tests/fuzz/make_corpus.py"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def out(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def npy(descr, shape, payload, version=1, fortran=False, pad_to=64):
    h = "{'descr': '%s', 'fortran_order': %s, 'shape': (%s), }" % (
        descr, "True" if fortran else "False", "".join("%d, " % s for s in shape) if len(shape) != 1 else "%d," % shape[0])
    pre = 10 if version == 1 else 12
    total = pre + len(h) + 1
    h = h + " " * ((-total) % pad_to) + "\n"
    if version == 1:
        head = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h))
    else:
        head = b"\x93NUMPY" + bytes([version, 0]) + struct.pack("<I", len(h))
    return head + h.encode("latin1") + payload


def f32(vals):
    return struct.pack("<%df" % len(vals), *vals)


# ---- .npy ----
out("npy", "f32_2x3", npy("<f4", (2, 3), f32([0, 1, -2, 3.5, 1e30, -1e-40])))
out("npy", "f16_4", npy("<f2", (4,), struct.pack("<4H", 0x3C00, 0x7C00, 0x7E00, 0x0001)))
out("npy", "f8_1", npy("<f8", (1,), struct.pack("<d", 2.5)))
out("npy", "u1_3d", npy("|u1", (2, 1, 3), bytes(range(6))))
out("npy", "i4_v2", npy("<i4", (2,), struct.pack("<2i", -1, 7), version=2))
out("npy", "i8_v3", npy("<i8", (1,), struct.pack("<q", 1 << 40), version=3))
out("npy", "scalar", npy("<f4", (), f32([4.0])))
out("npy", "empty", npy("<f4", (0, 5), b""))
out("npy", "bad_truncated", npy("<f4", (4, 4), f32([1.0] * 3)))
out("npy", "bad_hlen_past_end", b"\x93NUMPY\x01\x00\xff\xff{'descr'")
out("npy", "bad_hlen_huge_v2", b"\x93NUMPY\x02\x00\xff\xff\xff\x7f{}")
out("npy", "bad_magic", b"\x93NUMPX\x01\x00\x10\x00" + b" " * 16)
out("npy", "bad_dtype", npy("<c8", (1,), b"\0" * 8))
out("npy", "bad_bigendian", npy(">f4", (1,), b"\0" * 4))
out("npy", "bad_fortran", npy("<f4", (2, 2), f32([1, 2, 3, 4]), fortran=True))
out("npy", "bad_overflow", npy("<f4", (1 << 62, 1 << 62), b""))
out("npy", "bad_negative", npy("<f4", (-1, 2), b""))
out("npy", "bad_rank7", npy("<f4", (1,) * 7, f32([1])))
out("npy", "bad_extra_bytes", npy("<f4", (1,), f32([1, 2])))


# ---- .safetensors ----
def st(header, payload, raw_header=None):
    h = raw_header if raw_header is not None else json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h)) + h + payload


def ent(dtype, shape, a, b):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": [a, b]}


out("safetensors", "two", st({"x": ent("F32", (2,), 0, 8), "s": ent("F8_E8M0", (2, 1), 8, 10),
                              "__metadata__": {"k": "v"}}, f32([1, 2]) + b"\x7f\x80"))
out("safetensors", "all_dtypes", st({
    "a": ent("BF16", (1,), 0, 2), "b": ent("F16", (1,), 2, 4), "c": ent("F64", (1,), 4, 12), "d": ent("U8", (2,), 12, 14),
    "e": ent("I32", (1,), 14, 18), "f": ent("I64", (1,), 18, 26), "g": ent("U32", (1,), 26, 30),
    "h": ent("F8_E4M3", (1,), 30, 31), "i": ent("F8_E5M2", (1,), 31, 32)}, bytes(range(32))))
out("safetensors", "empty_set", st({}, b""))
out("safetensors", "zero_size", st({"z": ent("F32", (0, 3), 0, 0)}, b""))
out("safetensors", "bad_truncated", st({"x": ent("F32", (4,), 0, 16)}, f32([1])))
out("safetensors", "bad_hlen_past_end", struct.pack("<Q", 1 << 20) + b"{}")
out("safetensors", "bad_hlen_huge", struct.pack("<Q", (1 << 63) + 5) + b"{}")
out("safetensors", "bad_offset_range", st({"x": ent("F32", (1,), 0, 4000)}, f32([1])))
out("safetensors", "bad_overlap", st({"x": ent("F32", (1,), 0, 4), "y": ent("F32", (1,), 2, 6)}, b"\0" * 6))
out("safetensors", "bad_reversed", st({"x": ent("F32", (1,), 4, 0)}, b"\0" * 4))
out("safetensors", "bad_gap", st({"x": ent("F32", (1,), 4, 8)}, b"\0" * 8))
out("safetensors", "bad_bytes_vs_shape", st({"x": ent("F32", (3,), 0, 8)}, b"\0" * 8))
out("safetensors", "bad_dtype", st({"x": ent("C64", (1,), 0, 8)}, b"\0" * 8))
out("safetensors", "bad_duplicate", st(None, b"\0" * 8, raw_header=b'{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                                                             b'"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'))
out("safetensors", "bad_utf8_name", st(None, b"\0" * 4, raw_header=b'{"\xff\xfe":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'))
out("safetensors", "bad_overflow", st({"x": ent("F32", (1 << 40, 1 << 40), 0, 0)}, b""))
out("safetensors", "bad_negative_dim", st({"x": ent("F32", (-1,), 0, 0)}, b""))
out("safetensors", "bad_float_dim", st(None, b"", raw_header=b'{"x":{"dtype":"F32","shape":[1.5],"data_offsets":[0,0]}}'))
out("safetensors", "bad_json", st(None, b"", raw_header=b'{"x":{"dtype":"F32",'))

# ---- CLI argument vectors (NUL-separated) ----
for i, argv in enumerate([
        ["quantize", "in.npy", "out.safetensors", "--axis", "-1", "--scale-rule", "rceil", "--group=wrapx"],
        ["moe-bwd", "--H", "64", "--T=32", "-k", "2", "--bias", "--float8-dtype", "e5m2", "--threads", "2"],
        ["matmul-bwd", "--", "--H", "-x"], ["x", "--bias=1"], ["x", "--H"], ["x", "-h"], ["x", "--T", "99999999999999999999"],
        ["x", "--activation", "SWISH", "-a", "0x10", "a", "b", "c", "d"], ["x", "-", "--output", "", "--gate-clamp", "1,"]]):
    out("cli", "argv%d" % i, b"\0".join(a.encode() for a in argv))

# ---- quantize: 7 control bytes + raw value bits ----
def q(name, ctl, vals):
    out("quantize", name, bytes(ctl) + vals)


q("f32_rows", [1, 4, 63, 0, 1, 0x00, 0], f32([1, -2, 3e-3, 448, 1e-40, 0, -0.0, 65504]))
q("bf16_cols_e5m2_ocp", [1, 40, 9, 0, 0, 0x45, 0x80], struct.pack("<8H", 0x3F80, 0x7F80, 0xFF80, 0x7FC0, 1, 0x8001, 0x4780, 0))
q("f16_3d_rceil", [2, 3, 5, 33, 2, 0x88, 1], struct.pack("<6H", 0x3C00, 0x7C00, 0x0001, 0x8400, 0x7BFF, 0x3555))
q("wrapx", [1, 2, 0, 1, 1, 0x10, 2], f32([0.5, -7, 3, 1e10]))
q("nan_inf", [0, 31, 0, 0, 0, 0x01, 0], f32([float("nan"), float("inf"), -1.0, 2.0]))
q("bad_axis", [1, 4, 4, 0, 0x85, 0x00, 0], f32([1]))
q("bad_enums", [1, 4, 4, 0, 1, 0x2E, 0], f32([1]))
q("bad_shapes", [1, 4, 40, 0, 1, 0x00, 0x7C], f32([1]))
# ---- moe: T-1, E-1, B-1, selector (odd: route with top-k 1 + (sel >> 1) % E; even: backward), then ids ----
out("moe", "route_t5_e3_k2", bytes([4, 2, 3, 3, 0, 1, 2, 0, 1, 2, 0, 2, 1, 0, 0]))
out("moe", "route_dup", bytes([3, 2, 1, 3, 1, 1, 0, 2, 2, 0, 0]))
out("moe", "route_bad_id", bytes([2, 1, 1, 1, 0, 2, 1]))
# backward: flags (bit0 skip_token, bit1 single_expert_dense, bit2 num_valid_tokens), N-1, nvt, N*B token ids, N ids
out("moe", "bwd_valid", bytes([4, 1, 3, 0, 1, 1, 0, 0, 2, 4, 0xFF, 0xFF, 1, 3, 0xFF, 0xFF, 0, 1]))
out("moe", "bwd_skip0_pad_T", bytes([3, 1, 1, 0, 0, 1, 0, 0, 0xFE, 1, 2, 0xFE, 1, 0]))
out("moe", "bwd_bad_token", bytes([3, 1, 1, 0, 1, 0, 0, 5, 0, 0]))
out("moe", "bwd_bad_expert", bytes([3, 1, 1, 0, 1, 0, 0, 1, 2, 2]))
out("moe", "bwd_dense_nvt", bytes([7, 0, 3, 0, 6, 0, 3]))
out("moe", "bwd_dense_nvt_neg", bytes([7, 0, 3, 0, 6, 0, 0xF0]))
out("moe", "bwd_huge_ids", bytes([2, 1, 0, 0, 1, 0, 0, 0xFF, 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0x80, 0, 0, 0, 0]))
print("corpus written to", os.path.join(HERE, "corpus"))
