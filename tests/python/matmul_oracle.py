"""An independent FP64 oracle for matmul_mxfp8 (forward and backward), written from the specifications only
(OCP MX v1.0 §6.3, the NKI quantize_mx scale rule, the NKI matmul_mxfp8_backward page) with numpy + ml_dtypes.
It shares no code with libmxfp8; MX quantization, scale layouts, x4 packing and the NKI swizzle come from
tests/python/mx_oracle.py (the project's one independent MX oracle).

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

import mx_oracle

FMT = {"e4m3": (ml_dtypes.float8_e4m3fn, 8, 448.0), "e5m2": (ml_dtypes.float8_e5m2, 15, 57344.0)}
U_OUT = {"float32": (2.0 ** -24, 2.0 ** -149), "bfloat16": (2.0 ** -8, 2.0 ** -133), "float16": (2.0 ** -11, 2.0 ** -24)}


def fmt_name(f):
    f = f.lower()
    if f in ("e4m3", "float8_e4m3fn", "float8_e4m3"):
        return "e4m3"
    if f in ("e5m2", "float8_e5m2"):
        return "e5m2"
    raise ValueError(f)


def quantize(x, fmt="e4m3", rule="nki", group="1x32"):
    """x: 2-D array (float32 / bfloat16 / float16, or float64 holding such values), quantized along the last axis.
    Returns (codes as ml_dtypes float8 [R, K], scales uint8 [R, ceil(K/32)] in compact group order)."""
    fmt = fmt_name(fmt)
    x = np.asarray(x)
    if x.dtype == np.float64:
        x = x.astype(np.float32)  # exact: the values came from float32 / bfloat16 / float16
    codes, scales = mx_oracle.quantize(x, fmt, axis=-1, rule=rule, group=group)
    return codes.view(FMT[fmt][0]), scales


def dequantize(codes, scales, group="1x32"):
    """Exact float64 values of codes [R, K] (ml_dtypes float8) with compact scales [R, G]."""
    fmt = "e5m2" if codes.dtype == np.dtype(ml_dtypes.float8_e5m2) else "e4m3"
    return mx_oracle.dequantize(codes.view(np.uint8), scales, fmt, axis=-1, group=group, out_dtype=np.float64)


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
    return mx_oracle.to_layout(compact, K, layout)


def pack_x4(codes):
    """[R, K] FP8 codes -> [R, ceil(K/4)] uint32, byte c of word p = element 4p + c."""
    return mx_oracle.pack_x4(codes, axis=-1)


def swizzle(cf):
    """NKI swizzle of a [C, F] array (C % 128 == 0) into [C/4, 4F]."""
    return mx_oracle.swizzle_nki(cf)


def bias_grad(dy, out_dtype=np.float32):
    """The bias gradient sum_m dY[m, n] in the order the library documents, written from that text: per column,
    rows in chunks of 32 summed row after row from +0 in float32, then S(c0, k) = S(c0, h) + S(c0 + h, k - h) over
    the chunk sums with h the largest power of two below k; rounded once to out_dtype. Recursive (the library
    keeps a stack), vectorized over columns with numpy float32 arithmetic (one rounding per addition)."""
    dy = np.asarray(dy, dtype=np.float32)
    M, N = dy.shape
    chunks = []
    with np.errstate(over="ignore", invalid="ignore"):
        return _bias_grad_tree(dy, M, N, out_dtype)


def _bias_grad_tree(dy, M, N, out_dtype):
    chunks = []
    for m0 in range(0, M, 32):
        acc = np.zeros(N, dtype=np.float32)
        for m in range(m0, min(m0 + 32, M)):
            acc = (acc + dy[m]).astype(np.float32)
        chunks.append(acc)

    def tree(c0, k):
        if k == 1:
            return chunks[c0]
        h = 1 << ((k - 1).bit_length() - 1)  # the largest power of two below k
        return (tree(c0, h) + tree(c0 + h, k - h)).astype(np.float32)

    total = tree(0, len(chunks)) if chunks else np.zeros(N, dtype=np.float32)
    return total.astype(out_dtype)
