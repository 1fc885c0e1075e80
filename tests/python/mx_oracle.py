"""An independent oracle of MX quantization, written from the rules (OCP MX v1.0 §5-6.3, NKI quantize_mx)
with numpy and ml_dtypes only -- it shares no code with libmxfp8.

    codes, scales = quantize(x, fmt, axis, rule, group)   # codes: uint8 FP8 codes, scales: uint8 E8M0 codes
    values = dequantize(codes, scales, fmt, axis, group, out_dtype)

Rules:
  * groups of 32 along `axis`: "1x32" = [32g, 32g+32) with a zero-padded short last group; "wrapx" = Trainium's:
    the axis is cut in 512-tiles, the remainder in a 256 and/or a 128 subtile; in a (sub)tile at k0 of size P,
    S = P/4, group j holds {k0 + s*S + 8j + q : s < 4, q < 8}, compact index k0/32 + j.
  * amax = max |x| over the group's real values.
  * exponent from the FP32 bits of amax: floor(log2 amax) = biased exponent - 127 (normal) or the position of the
    top mantissa bit (subnormal). nki: e = fl - (emax - 1); ocp: e = fl - emax; rceil: the smallest e with
    amax <= max_normal * 2^e (= ceil(log2(amax / max_normal)), compared exactly in float64). e clamped to
    [-127, 127]; scale code = e + 127.
  * all-zero group -> code 0, elements x * 2^127 (signed zeros); any NaN/Inf -> code 255 and every element the
    format's NaN with its own sign (E4M3 0x7F, E5M2 0x7E).
  * element = RNE(x * 2^-e) saturated to +-max normal: x * 2^-e is exact in float64 and in float32 (it is a power
    of two times an FP32 value landing far below FP32's overflow), then clipped to +-max normal and cast by
    ml_dtypes. Clipping first equals RNE-then-saturate: anything above max normal would round to max normal or
    past it, and both saturate to max normal. (ml_dtypes' own cast does not saturate: 465 -> NaN in E4M3,
    61440 -> Inf in E5M2; and its float64 cast rounds via float32, so we hand it float32.)
  * values near FLT_MAX: a code whose value times 2^e exceeds FLT_MAX (possible only at the top scale of the nki
    and rceil rules) steps down to the largest code whose dequantized value is finite (include/mxfp8.h).
"""

import ml_dtypes
import numpy as np

FMT = {
    "e4m3": dict(dtype=np.dtype(ml_dtypes.float8_e4m3fn), emax=8, max_normal=448.0, nan=0x7F),
    "e5m2": dict(dtype=np.dtype(ml_dtypes.float8_e5m2), emax=15, max_normal=57344.0, nan=0x7E),
}


def to_f32(x):
    """float32 copy of x (float32 / bfloat16 / float16 are all exact in float32)."""
    x = np.asarray(x)
    assert x.dtype in (np.float32, np.float16, np.dtype(ml_dtypes.bfloat16)), x.dtype
    return x.astype(np.float32)


def wrapx_tiles(L):
    """[(k0, P)] of the wrapX tiling of an axis of length L (a multiple of 128)."""
    if L % 128:
        raise ValueError(f"wrapx needs a length that is a multiple of 128, got {L}")
    tiles, k0 = [], 0
    while L - k0 >= 512:
        tiles.append((k0, 512))
        k0 += 512
    for P in (256, 128):
        if L - k0 >= P:
            tiles.append((k0, P))
            k0 += P
    assert k0 == L
    return tiles


def group_index(L, group):
    """int array [G, 32]: the axis indices of each group's members, -1 for zero padding."""
    G = -(-L // 32)
    idx = np.full((G, 32), -1, dtype=np.int64)
    if group == "1x32":
        for g in range(G):
            n = min(32, L - 32 * g)
            idx[g, :n] = np.arange(32 * g, 32 * g + n)
    elif group == "wrapx":
        for k0, P in wrapx_tiles(L):
            S = P // 4
            for j in range(P // 32):
                idx[k0 // 32 + j] = [k0 + s * S + 8 * j + q for s in range(4) for q in range(8)]
        assert sorted(idx.ravel().tolist()) == list(range(L))
    else:
        raise ValueError(group)
    return idx


def floor_log2_f32(a):
    """floor(log2 a) for positive finite float32 values, read from the bits exactly."""
    bits = np.asarray(a, np.float32).view(np.uint32).astype(np.int64)
    exp = bits >> 23
    man = bits & 0x7FFFFF
    # subnormal: value = man * 2^-149, floor(log2) = bit_length(man) - 1 - 149
    bl = np.zeros_like(man)
    m = man.copy()
    for _ in range(23):
        nz = m > 0
        bl += nz
        m >>= 1
    return np.where(exp > 0, exp - 127, bl - 1 - 149)


def scale_exponent(amax, fmt, rule):
    """Unbiased shared exponent (before clamping) for positive finite float32 amax values (array)."""
    f = FMT[fmt]
    fl = floor_log2_f32(amax)
    if rule == "nki":
        return fl - (f["emax"] - 1)
    if rule == "ocp":
        return fl - f["emax"]
    if rule == "rceil":
        a = np.asarray(amax, np.float64)
        e = fl - f["emax"] - 1  # amax / max_normal > 2^(fl - emax - 1) always, since max_normal < 2^(emax + 1)
        for _ in range(3):
            e = np.where(a <= f["max_normal"] * np.exp2(e.astype(np.float64)), e, e + 1)
        assert np.all(a <= f["max_normal"] * np.exp2(e.astype(np.float64)))
        assert np.all(a > f["max_normal"] * np.exp2((e - 1).astype(np.float64)))
        return e
    raise ValueError(rule)


def encode(v, fmt):
    """FP8 codes (uint8) of float values v: RNE with saturation of finite values to +-max normal; NaN -> NaN;
    +-Inf -> +-Inf (E5M2) / NaN (E4M3)."""
    f = FMT[fmt]
    with np.errstate(invalid="ignore", over="ignore"):
        v32 = np.asarray(v, np.float64).astype(np.float32)
        finite = np.isfinite(v32)
        clipped = np.where(finite, np.clip(v32, -f["max_normal"], f["max_normal"]), v32).astype(np.float32)
        codes = clipped.astype(f["dtype"]).view(np.uint8)
    return codes


def quantize(x, fmt="e4m3", axis=-1, rule="nki", group="1x32"):
    """Oracle MX quantization. Returns (codes uint8 of x's shape, scales uint8 with axis -> ceil(L/32))."""
    f = FMT[fmt]
    x32 = to_f32(x)
    ax = axis % x32.ndim
    xm = np.moveaxis(x32, ax, -1)
    lead = xm.shape[:-1]
    L = xm.shape[-1]
    rows = xm.reshape(-1, L)
    R = rows.shape[0]
    idx = group_index(L, group)
    G = idx.shape[0]
    pad = idx < 0
    vals = np.where(pad[None], np.float32(0), rows[:, np.where(pad, 0, idx)])  # [R, G, 32]
    nonfinite = ~np.all(np.isfinite(vals), axis=-1)
    absv = np.where(np.isfinite(vals), np.abs(vals), np.float32(0))
    amax = absv.max(axis=-1).astype(np.float32)
    zero = amax == 0
    safe = np.where(zero, np.float32(1), amax)
    e = np.clip(scale_exponent(safe, fmt, rule), -127, 127)
    e = np.where(zero, -127, e)
    scales = (e + 127).astype(np.int64)
    scales = np.where(nonfinite, 255, scales).astype(np.uint8)
    scaled = vals.astype(np.float64) * np.exp2(-e.astype(np.float64))[..., None]
    codes = encode(scaled, fmt)
    # The dequantized value must stay finite in FP32 (include/mxfp8.h, "Values near FLT_MAX"): step a magnitude down
    # to the largest code whose value times 2^e is at most FLT_MAX (only at the top scale of the nki/rceil rules).
    flt_max = float(np.finfo(np.float32).max)
    while True:
        with np.errstate(invalid="ignore", over="ignore"):
            val = codes.view(f["dtype"]).astype(np.float64) * np.exp2(e.astype(np.float64))[..., None]
        over = ~nonfinite[..., None] & np.isfinite(scaled) & (np.abs(val) > flt_max)
        if not over.any():
            break
        codes = np.where(over, codes - np.uint8(1), codes).astype(np.uint8)
    sign = np.signbit(vals).astype(np.uint8) << 7
    codes = np.where(nonfinite[..., None], np.uint8(f["nan"]) | sign, codes).astype(np.uint8)
    out = np.zeros((R, L), np.uint8)
    r_idx = np.broadcast_to(np.arange(R)[:, None, None], codes.shape)
    k_idx = np.broadcast_to(idx[None], codes.shape)
    keep = k_idx >= 0
    out[r_idx[keep], k_idx[keep]] = codes[keep]
    out = np.moveaxis(out.reshape(lead + (L,)), -1, ax)
    sc = np.moveaxis(scales.reshape(lead + (G,)), -1, ax)
    return np.ascontiguousarray(out), np.ascontiguousarray(sc)


def decode(codes, fmt):
    """Exact float64 values of FP8 codes (via ml_dtypes)."""
    return np.asarray(codes, np.uint8).view(FMT[fmt]["dtype"]).astype(np.float64)


def dequantize(codes, scales, fmt="e4m3", axis=-1, group="1x32", out_dtype=np.float32):
    """Oracle dequantization: fp8(code) * 2^(scale - 127) exactly, NaN for scale 255, then rounded (RNE) once to
    out_dtype."""
    codes = np.asarray(codes, np.uint8)
    ax = axis % codes.ndim
    cm = np.moveaxis(codes, ax, -1)
    sm = np.moveaxis(np.asarray(scales, np.uint8), ax, -1)
    L = cm.shape[-1]
    idx = group_index(L, group)
    gi = np.zeros(L, np.int64)
    for g in range(idx.shape[0]):
        m = idx[g][idx[g] >= 0]
        gi[m] = g
    s = sm[..., gi].astype(np.int64)  # scale code of each element
    v = decode(cm, fmt) * np.exp2((s - 127).astype(np.float64))
    v = np.where(s == 255, np.nan, v)
    with np.errstate(over="ignore"):
        out = v.astype(np.float32)  # exact (or +-Inf beyond FP32's range)
    out = out.astype(out_dtype)
    return np.moveaxis(out, -1, ax)

# ---- scale layouts, x4 packing, NKI swizzle (formulas of include/mxfp8.h) ----
def to_layout(compact, K, layout):
    """Scales in `layout` from the formulas of include/mxfp8.h."""
    F, G = compact.shape
    if layout == "compact":
        return compact.copy()
    if layout == "nki_unpacked":
        out = np.zeros((-(-G // 4) * 32, F), np.uint8)
        for g in range(G):
            out[(g // 4) * 32 + g % 4] = compact[:, g]
        return out
    if layout == "nki_packed":
        out = np.zeros((-(-K // 2048) * 128, F), np.uint8)
        for g in range(G):
            out[(g // 64) * 128 + ((g % 64) // 16) * 4 + ((g % 16) // 4) * 32 + g % 4] = compact[:, g]
        return out
    if layout == "swizzle_128x4":
        R2, C2 = -(-F // 128) * 128, -(-G // 4) * 4
        flat = np.zeros(R2 * C2, np.uint8)
        r, c = np.meshgrid(np.arange(F), np.arange(G), indexing="ij")
        off = ((r // 128) * (C2 // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
        flat[off] = compact
        return flat.reshape(R2, C2)
    raise ValueError(layout)


def pack_x4(codes, axis=-1):
    """FP8 codes -> uint32 words along axis: byte c (least significant first) of word p = element 4p + c."""
    c = np.moveaxis(np.asarray(codes).view(np.uint8), axis, -1).astype(np.uint32)
    L = c.shape[-1]
    P = -(-L // 4)
    padded = np.zeros(c.shape[:-1] + (4 * P,), np.uint32)
    padded[..., :L] = c
    p = padded.reshape(c.shape[:-1] + (P, 4))
    words = p[..., 0] | (p[..., 1] << 8) | (p[..., 2] << 16) | (p[..., 3] << 24)
    return np.moveaxis(words, -1, axis)


def swizzle_nki(x):
    """NKI swizzle of [K, F] (K % 128 == 0) into [K/4, 4F]: out[k0/4 + p, 4f + s] = x[k0 + s*S + p, f]."""
    K, F = x.shape
    out = np.zeros((K // 4, 4 * F), x.dtype)
    for k0, P in wrapx_tiles(K):
        S = P // 4
        for s in range(4):
            out[k0 // 4: k0 // 4 + S, s::4] = x[k0 + s * S: k0 + (s + 1) * S, :]
    return out
