"""An independent FP64 oracle for matmul_mxfp8 (forward and backward), written from the specifications only
(OCP MX v1.0 §6.3, the NKI quantize_mx scale rule, the NKI matmul_mxfp8_backward page) with numpy + ml_dtypes.
It shares no code with libmxfp8 or with tests/python/mx_oracle.py.

quantize(x, fmt, rule, group) quantizes a 2-D array along its LAST axis:
  groups: "1x32" = 32 contiguous indices (short last group); "wrapx" = Trainium's: the axis is cut in 512-tiles,
          then 256 / 128 subtiles; in a (sub)tile at k0 of size P, S = P/4, group j = {k0 + s*S + 8j + q}.
  per group: amax over the group's values (padding never counts); NaN/Inf anywhere -> scale code 255, NaN elements;
          amax == 0 -> code 0, zero elements; else e = rule(amax) clamped to [-127, 127], code e + 127, elements
          RNE(x * 2^-e) in FP8 saturating at +-max normal.
  rules:  nki   e = floor(log2 amax) - (emax - 1)      emax = 8 (E4M3), 15 (E5M2)
          ocp   e = floor(log2 amax) - emax
          rceil e = ceil(log2(amax / max_normal))       max_normal = 448, 57344
dequantize: fp8 * 2^(code - 127) in float64 (code 255 -> NaN).
Backward: dX = deq(Q_N(dY)) @ deq(Q_N(W^T))^T; dW = deq(Q_M(dY^T)) @ deq(Q_M(X^T))^T, products and sums in float64.

bound(): the error a kernel may have against the oracle when it accumulates in FP32 (any order of K' fused or
unfused steps) and rounds once to the output type:
  |out - exact| <= gamma(K') * S * (1 + u_out) + u_out * |exact| + K' * 2^-148 + tiny_out
  where S = sum_k |a_k b_k| (dequantized operands), gamma(n) = n*u/(1 - n*u), u = 2^-24, u_out the output's unit
  roundoff (2^-24 F32, 2^-8 BF16, 2^-11 F16) and tiny_out its smallest subnormal (absolute error of underflow).
"""

import ml_dtypes
import numpy as np

FMT = {"e4m3": (ml_dtypes.float8_e4m3fn, 8, 448.0), "e5m2": (ml_dtypes.float8_e5m2, 15, 57344.0)}
U_OUT = {"float32": (2.0 ** -24, 2.0 ** -149), "bfloat16": (2.0 ** -8, 2.0 ** -133), "float16": (2.0 ** -11, 2.0 ** -24)}


def fmt_name(f):
    f = f.lower()
    if f in ("e4m3", "float8_e4m3fn", "float8_e4m3"):
        return "e4m3"
    if f in ("e5m2", "float8_e5m2"):
        return "e5m2"
    raise ValueError(f)


def group_perm(K, group):
    """Index array p such that groups are the 32-blocks of x[:, p] (compact group order)."""
    if group == "1x32":
        return np.arange(K)
    assert K % 128 == 0, K
    tiles = []
    k0 = 0
    while K - k0 >= 512:
        tiles.append((k0, 512))
        k0 += 512
    for P in (256, 128):
        if K - k0 >= P:
            tiles.append((k0, P))
            k0 += P
    assert k0 == K
    out = []
    for k0, P in tiles:
        S = P // 4
        for j in range(P // 32):
            for s in range(4):
                out.extend(k0 + s * S + 8 * j + q for q in range(8))
    p = np.array(out)
    assert sorted(p.tolist()) == list(range(K))
    return p


def _exponent(amax, fmt, rule):
    _, emax, maxn = FMT[fmt]
    m, e2 = np.frexp(amax)  # amax = m * 2^e2, m in [0.5, 1)
    fl = e2 - 1              # floor(log2 amax), exact (also for subnormal amax)
    if rule == "nki":
        e = fl - (emax - 1)
    elif rule == "ocp":
        e = fl - emax
    elif rule == "rceil":
        e = np.ceil(np.log2(amax / maxn)).astype(np.int64)
        # make it exact: smallest e with maxn * 2^e >= amax
        for _ in range(2):
            lower = maxn * np.exp2((e - 1).astype(np.float64)) >= amax
            e = np.where(lower, e - 1, e)
            higher = maxn * np.exp2(e.astype(np.float64)) < amax
            e = np.where(higher, e + 1, e)
    else:
        raise ValueError(rule)
    return np.clip(e, -127, 127).astype(np.int64)


def quantize(x, fmt="e4m3", rule="nki", group="1x32"):
    """x: 2-D array (float32 / bfloat16 / float16 / float64 holding such values), quantized along the last axis.
    Returns (codes as ml_dtypes float8 [R, K], scales uint8 [R, ceil(K/32)] in compact group order)."""
    fmt = fmt_name(fmt)
    dt, _, maxn = FMT[fmt]
    x = np.asarray(x).astype(np.float64)
    R, K = x.shape
    G = -(-K // 32)
    p = group_perm(K, group)
    xp = np.zeros((R, G * 32))
    xp[:, :K] = x[:, p]
    valid = np.zeros(G * 32, bool)
    valid[:K] = True
    g3 = xp.reshape(R, G, 32)
    v3 = np.broadcast_to(valid.reshape(G, 32), g3.shape)
    nonfinite = (~np.isfinite(g3) & v3).any(axis=2)
    amax = np.where(v3 & np.isfinite(g3), np.abs(g3), 0.0).max(axis=2)
    safe = np.where(amax > 0, amax, 1.0)
    e = _exponent(safe, fmt, rule)
    e = np.where(amax > 0, e, -127)
    scale = (e + 127).astype(np.int64)
    with np.errstate(invalid="ignore", over="ignore"):
        y = g3 * np.exp2(-e.astype(np.float64))[:, :, None]
        y = np.clip(y, -maxn, maxn)
    codes3 = y.astype(dt)
    nan_code = np.array(np.nan).astype(dt)
    codes3 = np.where(nonfinite[:, :, None], nan_code, codes3)
    scale = np.where(nonfinite, 255, scale).astype(np.uint8)
    flat = codes3.reshape(R, G * 32)[:, :K]
    codes = np.empty((R, K), dt)
    codes[:, p] = flat
    return codes, scale


def dequantize(codes, scales, group="1x32"):
    """Exact float64 values of codes [R, K] with compact scales [R, G]."""
    R, K = codes.shape
    p = group_perm(K, group)
    v = codes.astype(np.float64)
    gidx = np.empty(K, np.int64)
    gidx[p] = np.arange(K) // 32
    s = scales.astype(np.int64)[:, gidx]
    with np.errstate(invalid="ignore"):
        out = v * np.exp2((s - 127).astype(np.float64))
    return np.where(s == 255, np.nan, out)


def qdq(x, fmt, rule, group):
    c, s = quantize(x, fmt, rule, group)
    return dequantize(c, s, group)


def gemm(a, b, fmt, rule, group):
    """(exact FP64 C = qdq(A) @ qdq(B)^T, S = |qdq(A)| @ |qdq(B)|^T, K) for A [M, K], B [N, K]."""
    qa, qb = qdq(a, fmt, rule, group), qdq(b, fmt, rule, group)
    with np.errstate(invalid="ignore", over="ignore"):
        return qa @ qb.T, np.abs(qa) @ np.abs(qb).T, a.shape[1]


def backward(dy, w, x, fmt="e5m2", rule="nki", group="1x32"):
    """((dX, S_dX, N), (dW, S_dW, M)) of the backward, from the high-precision inputs (float arrays)."""
    dy = np.asarray(dy).astype(np.float64)
    w = np.asarray(w).astype(np.float64)
    x = np.asarray(x).astype(np.float64)
    return gemm(dy, w.T, fmt, rule, group), gemm(dy.T, x.T, fmt, rule, group)


def bound(exact, S, K, out_dtype="float32"):
    u = 2.0 ** -24
    n = max(int(K), 1)
    gamma = n * u / (1 - n * u)
    uo, tiny = U_OUT[out_dtype]
    return gamma * S * (1 + uo) + uo * np.abs(exact) + n * 2.0 ** -148 + tiny


# ---- layouts (from the specifications in include/mxfp8.h / the NKI docs), for pre-quantized operands ----
def to_layout(compact, K, layout):
    """compact scales [F, G] -> layout array (uint8)."""
    F, G = compact.shape
    if layout == "compact":
        return compact.copy()
    if layout == "nki_unpacked":
        out = np.zeros((-(-G // 4) * 32, F), np.uint8)
        for g in range(G):
            out[(g // 4) * 32 + g % 4, :] = compact[:, g]
        return out
    if layout == "nki_packed":
        out = np.zeros((-(-K // 2048) * 128, F), np.uint8)
        for g in range(G):
            out[(g // 64) * 128 + ((g % 64) // 16) * 4 + ((g % 16) // 4) * 32 + g % 4, :] = compact[:, g]
        return out
    if layout == "swizzle_128x4":
        Rp, Cp = -(-F // 128) * 128, -(-G // 4) * 4
        flat = np.zeros(Rp * Cp, np.uint8)
        for r in range(F):
            for c in range(G):
                flat[((r // 128) * (Cp // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4] = \
                    compact[r, c]
        return flat.reshape(Rp, Cp)
    raise ValueError(layout)


def pack_x4(codes):
    """[R, K] FP8 codes -> [R, ceil(K/4)] uint32, byte c of word p = element 4p + c."""
    u = codes.view(np.uint8)
    R, K = u.shape
    Kp = -(-K // 4) * 4
    pad = np.zeros((R, Kp), np.uint32)
    pad[:, :K] = u
    w = pad.reshape(R, Kp // 4, 4)
    return (w[:, :, 0] | (w[:, :, 1] << 8) | (w[:, :, 2] << 16) | (w[:, :, 3] << 24)).astype(np.uint32)


def swizzle(cf):
    """NKI swizzle of a [C, F] array (C % 128 == 0) into [C/4, 4F]: out[k0/4 + p, 4f + s] = in[k0 + s*S + p, f]."""
    C, F = cf.shape
    out = np.zeros((C // 4, 4 * F), cf.dtype)
    p = group_perm(C, "wrapx")  # only to reuse the tiling; recompute tiles directly below
    del p
    k0 = 0
    tiles = []
    while C - k0 >= 512:
        tiles.append((k0, 512))
        k0 += 512
    for P in (256, 128):
        if C - k0 >= P:
            tiles.append((k0, P))
            k0 += P
    for k0, P in tiles:
        S = P // 4
        for s in range(4):
            out[k0 // 4: k0 // 4 + S, s::4] = cf[k0 + s * S: k0 + (s + 1) * S, :]
    return out
