"""An independent FP64 numpy oracle of the blockwise MoE layer and its backward, written from the NKI
pages' definition -- it shares no code with libmxfp8 (MX quantization comes from mx_oracle.py, itself independent).

Layer (X [T, H], W1 [E, H, 2, I], W2 [E, I, H], a [T*E], biases b1 [E, 2, I], b2 [E, H]); block n of B positions
belongs to expert e = block_to_expert[n]; position p holds token t = token_position_to_id[n*B + p] when
0 <= t < T (and t < num_valid_tokens), else padding (a zero row that contributes nothing):
    g = clamp(X[t] @ W1[e][:, 0, :] + b1[e, 0]);  u = clamp(X[t] @ W1[e][:, 1, :] + b1[e, 1])
    inter = act(g) * u;  down = inter @ W2[e] + b2[e];  out[t] += a[t*E + e] * down
Backward with upstream gradient dY (loss = sum(out * dY)):
    AFFINITY_ON_I: dI_raw = dY[t] @ W2[e]^T; da = sum_i dI_raw*inter + sum_h dY*b2; dI = a*dI_raw;
                   dW2[e] += (a*inter)^T dY
    AFFINITY_ON_H: D = a*dY[t]; dI = D @ W2[e]^T; da = sum_h dY*down; dW2[e] += inter^T D
    d_gate = dI*u*act'(g)*[lo_g < g < hi_g]; d_up = dI*act(g)*[lo_u < u < hi_u]; dGU = [d_gate | d_up]
    dX[t] += dGU @ W1[e]^T (W1[e] as [H, 2I]); dW1[e] += X^T dGU; db1[e] += sum dGU; db2[e] += sum a*dY
Quantized variant (quant=dict(fmt=..., rule=...)): every GEMM operand is rounded to float32 and MX-quantized in 1x32
groups along that GEMM's contraction axis (H, I, H, 2I, and the block's B positions for the weight gradients, groups
starting at position 0), dequantized exactly, and the GEMM runs in float64.
"""

import numpy as np

import mx_oracle

K_SWISH = 1.702


def act(name, g):
    if name == "silu":
        return g / (1.0 + np.exp(-g))
    if name == "swish":
        return g / (1.0 + np.exp(-K_SWISH * g))
    if name == "squared_relu":
        return np.where(g > 0.0, g, np.where(np.isnan(g), g, 0.0)) ** 2  # NaN stays NaN
    raise ValueError(name)


def dact(name, g):
    if name == "silu":
        s = 1.0 / (1.0 + np.exp(-g))
        return s + g * s * (1.0 - s)
    if name == "swish":
        s = 1.0 / (1.0 + np.exp(-K_SWISH * g))
        return s + K_SWISH * g * s * (1.0 - s)
    if name == "squared_relu":
        return 2.0 * np.where(g > 0.0, g, np.where(np.isnan(g), g, 0.0))
    raise ValueError(name)


def clamp_pass(x, lo, hi):
    """Gradient mask of a clamp (an absent limit is unbounded; non-finite values propagate): an
    absent limit (None = -inf / +inf) masks nothing; a present one masks x <= lo / x >= hi; NaN is never masked."""
    x = np.asarray(x)
    m = np.ones(x.shape, bool)
    with np.errstate(invalid="ignore"):
        if lo != -np.inf:
            m &= ~(x <= lo)
        if hi != np.inf:
            m &= ~(x >= hi)
    return m


def num_blocks(T, K, E, B):
    num = T * K - (E - 1)
    q = -((-num) // B)  # ceil, also for negative num
    return q + E - 1


def route(topk_ids, topk_weights, E, B, pad=-1):
    """Oracle router: expert e gets ceil(count/B) blocks (expert order), tokens ascending, padded with `pad`;
    leftover blocks are padding owned by E-1; a[t*E+e] = weight."""
    ids = np.asarray(topk_ids)
    T, K = ids.shape
    N = num_blocks(T, K, E, B)
    tok, be = [], []
    for e in range(E):
        ts = [t for t in range(T) if e in ids[t]]
        nb = -(-len(ts) // B)
        for b in range(nb):
            chunk = ts[b * B:(b + 1) * B]
            tok += chunk + [pad] * (B - len(chunk))
            be.append(e)
    while len(be) < N:
        tok += [pad] * B
        be.append(E - 1)
    a = np.zeros(T * E, np.float64)
    for t in range(T):
        for k in range(K):
            a[t * E + ids[t, k]] = float(topk_weights[t, k])
    return np.array(tok, np.int64), np.array(be, np.int64), a


def qdq(x, axis, quant):
    """MX quantize-dequantize of x along axis (float64 in, float64 out); identity when quant is None."""
    if quant is None:
        return np.asarray(x, np.float64)
    x32 = np.asarray(x, np.float64).astype(np.float32)
    codes, scales = mx_oracle.quantize(x32, quant["fmt"], axis=axis, rule=quant.get("rule", "nki"), group="1x32")
    return mx_oracle.dequantize(codes, scales, quant["fmt"], axis=axis, group="1x32",
                                out_dtype=np.float32).astype(np.float64)


def mm(a, b, ka, kb, quant):
    """a @ b where a's contraction axis is ka and b's is kb (each quantized along it): plain 2-D matmul."""
    return qdq(a, ka, quant) @ qdq(b, kb, quant)


def _blocks(tok, be, B, T, V):
    tok = np.asarray(tok).reshape(-1)
    for n in range(len(be)):
        t = tok[n * B:(n + 1) * B].astype(np.int64)
        real = (t >= 0) & (t < T) & (t < V)
        yield n, int(np.asarray(be).reshape(-1)[n]), np.where(real, t, 0), real


def _gather(M, t, real):
    out = np.asarray(M, np.float64)[t].copy()
    out[~real] = 0.0
    return out


def forward(X, a, W1, W2, tok, be, B, *, b1=None, b2=None, activation="silu", clamps=(None, None, None, None),
            quant=None, V=None, gu_override=None):
    """Returns (out [T, H], per-block dict list with g, u, act, inter, down, t, real). clamps = (gate_lo, gate_hi,
    up_lo, up_hi), None = no limit. gu_override(n) -> (g, u) [B, I] replaces the computed g, u of block n."""
    X = np.asarray(X, np.float64)
    T, H = X.shape
    E, _, _, I = W1.shape
    V = T if V is None else min(V, T)
    W1 = np.asarray(W1, np.float64)
    W2 = np.asarray(W2, np.float64)
    a = np.asarray(a, np.float64).reshape(-1)
    b1 = np.zeros((E, 2, I)) if b1 is None else np.asarray(b1, np.float64)
    b2 = np.zeros((E, H)) if b2 is None else np.asarray(b2, np.float64)
    glo, ghi, ulo, uhi = [(-np.inf if i % 2 == 0 else np.inf) if c is None else c for i, c in enumerate(clamps)]
    out = np.zeros((T, H))
    blocks = []
    for n, e, t, real in _blocks(tok, be, B, T, V):
        xb = _gather(X, t, real)
        w1 = W1[e].reshape(H, 2 * I)
        gu = mm(xb, w1, 1, 0, quant)
        g = np.clip(gu[:, :I] + b1[e, 0], glo, ghi)
        u = np.clip(gu[:, I:] + b1[e, 1], ulo, uhi)
        if gu_override is not None:
            g, u = gu_override(n)
        g[~real] = 0.0
        u[~real] = 0.0
        ac = act(activation, g)
        inter = ac * u
        down = mm(inter, W2[e], 1, 0, quant) + b2[e]
        down[~real] = 0.0
        ab = np.where(real, a[t * E + e], 0.0)
        np.add.at(out, t[real], (ab[:, None] * down)[real])
        blocks.append(dict(n=n, e=e, t=t, real=real, xb=xb, g=g, u=u, act=ac, inter=inter, down=down, ab=ab))
    return out, blocks


def backward(X, a, W1, W2, tok, be, dY, B, *, b1=None, b2=None, activation="silu", affinity="on_i",
             clamps=(None, None, None, None), quant=None, V=None, gu_override=None):
    """Gradients dict: hidden_states_grad [T, H], expert_affinities_masked_grad [T*E, 1],
    gate_up_proj_weight_grad [E, H, 2, I], down_proj_weight_grad [E, I, H], gate_and_up_proj_bias_grad [E, 2, I],
    down_proj_bias_grad [E, H]."""
    X = np.asarray(X, np.float64)
    T, H = X.shape
    E, _, _, I = W1.shape
    W1 = np.asarray(W1, np.float64)
    W2 = np.asarray(W2, np.float64)
    dY = np.asarray(dY, np.float64)
    glo, ghi, ulo, uhi = [(-np.inf if i % 2 == 0 else np.inf) if c is None else c for i, c in enumerate(clamps)]
    b2v = np.zeros((E, H)) if b2 is None else np.asarray(b2, np.float64)
    _, blocks = forward(X, a, W1, W2, tok, be, B, b1=b1, b2=b2, activation=activation, clamps=clamps, quant=quant,
                        V=V, gu_override=gu_override)
    dX = np.zeros((T, H))
    da = np.zeros(T * E)
    dW1 = np.zeros((E, H, 2 * I))
    dW2 = np.zeros((E, I, H))
    db1 = np.zeros((E, 2 * I))
    db2 = np.zeros((E, H))
    for blk in blocks:
        e, t, real, ab = blk["e"], blk["t"], blk["real"], blk["ab"]
        g, u, ac, inter = blk["g"], blk["u"], blk["act"], blk["inter"]
        dyb = _gather(dY, t, real)
        if affinity == "on_i":
            dI_raw = mm(dyb, W2[e].T, 1, 0, quant)
            dab = (dI_raw * inter).sum(1) + dyb @ b2v[e]
            dI = ab[:, None] * dI_raw
            dW2[e] += mm((ab[:, None] * inter).T, dyb, 1, 0, quant)
        else:
            D = ab[:, None] * dyb
            dI = mm(D, W2[e].T, 1, 0, quant)
            dab = (dyb * blk["down"]).sum(1)
            dW2[e] += mm(inter.T, D, 1, 0, quant)
        dg = np.where(clamp_pass(g, glo, ghi), dI * u * dact(activation, g), 0.0)
        du = np.where(clamp_pass(u, ulo, uhi), dI * ac, 0.0)
        dgu = np.concatenate([dg, du], axis=1)
        dgu[~real] = 0.0
        np.add.at(dX, t[real], mm(dgu, W1[e].reshape(H, 2 * I).T, 1, 0, quant)[real])
        dW1[e] += mm(blk["xb"].T, dgu, 1, 0, quant)
        db1[e] += dgu.sum(0)
        db2[e] += (ab[:, None] * dyb)[real].sum(0)
        np.add.at(da, (t * E + e)[real], dab[real])
    return dict(hidden_states_grad=dX, expert_affinities_masked_grad=da.reshape(-1, 1),
                gate_up_proj_weight_grad=dW1.reshape(E, H, 2, I), down_proj_weight_grad=dW2,
                gate_and_up_proj_bias_grad=db1.reshape(E, 2, I), down_proj_bias_grad=db2)


def nki_criteria(k, g, atol_frac=0.5, rtol=1e-3):
    """The upstream MoE test's pass criteria of a kernel output k against a golden g."""
    k = np.asarray(k, np.float64).ravel()
    g = np.asarray(g, np.float64).ravel()
    atol = atol_frac * np.abs(g).max() if g.size else 0.0
    allclose = bool(np.all(np.abs(k - g) <= atol + rtol * np.abs(g)))
    nk, ng = np.linalg.norm(k), np.linalg.norm(g)
    cos = float(k @ g / (nk * ng)) if nk > 0 and ng > 0 else 1.0
    ne = float(np.linalg.norm(k - g) / (nk + ng)) if nk + ng > 0 else 0.0
    return dict(allclose=allclose, cosine=cos, norm_euclid=ne,
                passed=allclose and cos >= 0.99 and ne <= 0.70)
