"""Helpers around the blockwise MoE kernels: the router's gradient and the expert-weight layouts of Hugging Face
Mixtral-style checkpoints. Pure numpy (gathers and transposes; no arithmetic), dtypes are kept.

    dW = mxfp8.topk_weights_grad(expert_affinities_masked_grad, topk_ids)          # [T*E, 1] -> [T, K]
    gate_up_proj_weight, down_proj_weight = mxfp8.from_mixtral(w1, w3, w2)       # HF -> [E, H, 2, I], [E, I, H]
    w1, w3, w2 = mxfp8.to_mixtral(gate_up_proj_weight, down_proj_weight)         # and back

Layouts. Hugging Face's MixtralSparseMoeBlock holds, per expert e, three bias-free nn.Linear layers
(``experts.{e}.w1``, ``.w3``, ``.w2``) whose weights are [out_features, in_features]:
    w1 [I, H]  the gate projection  (x @ w1.T, goes through the activation)
    w3 [I, H]  the up projection    (x @ w3.T)
    w2 [H, I]  the down projection  (y = (act(x @ w1.T) * (x @ w3.T)) @ w2.T)
(I = intermediate_size / ffn_dim, H = hidden_size.) Llama-style experts named gate_proj / up_proj / down_proj have
the same layouts as w1 / w3 / w2. The kernels take
    gate_up_proj_weight [E, H, 2, I]: [e, :, 0, :] = w1[e].T (gate), [e, :, 1, :] = w3[e].T (up)
    down_proj_weight    [E, I, H]:    [e] = w2[e].T
so g = x @ gate_up_proj_weight[e][:, 0], u = x @ gate_up_proj_weight[e][:, 1], y = (act(g) * u) @ down_proj_weight[e].
"""

import numpy as np

__all__ = ["topk_weights_grad", "from_mixtral", "to_mixtral"]


def _ids(topk_ids):
    ids = np.asarray(topk_ids)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"topk_ids: expected an integer array, got dtype {ids.dtype}")
    if ids.ndim != 2:
        raise ValueError(f"topk_ids: expected [T, K], got shape {ids.shape}")
    return ids


def topk_weights_grad(expert_affinities_masked_grad, topk_ids, num_experts=None):
    """The gradient of the router's top-k weights from the backward's affinity gradient.

    `mxfp8.route` copies topk_weights[t, k] to expert_affinities_masked[t*E + topk_ids[t, k]], so the gradient of
    topk_weights[t, k] is expert_affinities_masked_grad[t*E + topk_ids[t, k]]: a gather, exact, in the gradient's
    dtype. Entries of experts a token does not route to are not read. (When the top-k weights were normalized or
    came from a softmax, chain this with that function's backward, e.g. through torch autograd.)

    Parameters
    ----------
    expert_affinities_masked_grad : array [T * E, 1] or [T * E]
        As returned by blockwise_mm_bwd_mxfp8 (any float dtype).
    topk_ids : integer array [T, K]
        The ids given to `route`: in [0, E), distinct within a row.
    num_experts : int or None
        E; None = size / T (needed only when T = 0).

    Returns
    -------
    array [T, K] of the gradient's dtype. Raises TypeError (dtypes), ValueError (shapes that do not fit
    [T * E], ids out of range or repeated within a row).
    """
    g = np.asarray(expert_affinities_masked_grad)
    ids = _ids(topk_ids)
    T, K = ids.shape
    if g.ndim not in (1, 2) or (g.ndim == 2 and g.shape[1] != 1):
        raise ValueError(f"expert_affinities_masked_grad: expected [T*E, 1] or [T*E], got shape {g.shape}")
    if g.dtype.kind not in "fV":  # V: ml_dtypes' bfloat16 / float8 report kind 'V'
        raise TypeError(f"expert_affinities_masked_grad: expected a float array, got dtype {g.dtype}")
    if num_experts is None:
        if T == 0:
            raise ValueError("num_experts: needed when topk_ids has no rows (T = 0)")
        if g.size % T:
            raise ValueError(f"expert_affinities_masked_grad: {g.size} entries are not T*E for T = {T} tokens")
        E = g.size // T
    else:
        E = int(num_experts)
        if E < 1 or g.size != T * E:
            raise ValueError(f"expert_affinities_masked_grad: {g.size} entries, expected T*E = {T}*{E}")
    if ids.size and (ids.min() < 0 or ids.max() >= E):
        raise ValueError(f"topk_ids: ids must lie in [0, {E}), got [{ids.min()}, {ids.max()}]")
    if K > 1 and ids.size and (np.diff(np.sort(ids, axis=1), axis=1) == 0).any():
        raise ValueError("topk_ids: an expert appears twice in one row")
    return g.reshape(T, E)[np.arange(T)[:, None], ids]


def _stack(w, name, ndim):
    """A stacked [E, ...] array of per-expert weights: an array of rank `ndim`, or a sequence of rank-2 arrays."""
    if isinstance(w, (list, tuple)):
        if not w:
            raise ValueError(f"{name}: no experts given")
        w = np.stack([np.asarray(x) for x in w])
    w = np.asarray(w)
    if w.ndim != ndim:
        raise ValueError(f"{name}: expected [E, {'rows, cols' if ndim == 3 else '...'}] (or a list of E 2-D "
                         f"per-expert weights), got shape {w.shape}")
    return w


def from_mixtral(w1, w3, w2):
    """Hugging Face Mixtral expert weights -> (gate_up_proj_weight [E, H, 2, I], down_proj_weight [E, I, H]).

    w1, w3 : [E, I, H] arrays, or lists of E per-expert [I, H] weights (experts.{e}.w1.weight / .w3.weight: the
        gate and up projections). w2 : [E, H, I], or a list of E [H, I] weights (experts.{e}.w2.weight: the down
        projection). See the module doc for both layouts. w1 and w3 must have one dtype; each output keeps its
        input's dtype (numpy or ml_dtypes, e.g. bfloat16).
    Returns C-contiguous copies. Raises ValueError (shapes that disagree), TypeError (w1 and w3 of different dtypes).
    """
    w1 = _stack(w1, "w1", 3)
    w3 = _stack(w3, "w3", 3)
    w2 = _stack(w2, "w2", 3)
    if w1.shape != w3.shape:
        raise ValueError(f"w1 {w1.shape} and w3 {w3.shape}: the gate and up projections must have one shape "
                         "[E, I, H]")
    E, I, H = w1.shape
    if w2.shape != (E, H, I):
        raise ValueError(f"w2: expected [E, H, I] = {[E, H, I]} to match w1 [E, I, H] = {[E, I, H]}, got "
                         f"{list(w2.shape)}")
    if w1.dtype != w3.dtype:
        raise TypeError(f"w1 ({w1.dtype}) and w3 ({w3.dtype}) must have one dtype")
    gate_up = np.empty((E, H, 2, I), w1.dtype)
    gate_up[:, :, 0, :] = w1.transpose(0, 2, 1)
    gate_up[:, :, 1, :] = w3.transpose(0, 2, 1)
    down = np.ascontiguousarray(w2.transpose(0, 2, 1))
    return gate_up, down


def to_mixtral(gate_up_proj_weight, down_proj_weight):
    """Inverse of `from_mixtral`: (gate_up_proj_weight [E, H, 2, I], down_proj_weight [E, I, H]) -> (w1 [E, I, H],
    w3 [E, I, H], w2 [E, H, I]) in Hugging Face Mixtral's layout (per expert: w1[e], w3[e], w2[e] are the
    experts.{e}.w1 / w3 / w2 nn.Linear weights). Dtypes kept; C-contiguous copies. Also maps the weight gradients
    of blockwise_mm_bwd_mxfp8 (same shapes) to the gradients of the Mixtral weights. Raises ValueError (shapes)."""
    gu = np.asarray(gate_up_proj_weight)
    dn = np.asarray(down_proj_weight)
    if gu.ndim != 4 or gu.shape[2] != 2:
        raise ValueError(f"gate_up_proj_weight: expected [E, H, 2, I], got shape {gu.shape}")
    E, H, _, I = gu.shape
    if dn.shape != (E, I, H):
        raise ValueError(f"down_proj_weight: expected [E, I, H] = {[E, I, H]}, got {list(dn.shape)}")
    w1 = np.ascontiguousarray(gu[:, :, 0, :].transpose(0, 2, 1))
    w3 = np.ascontiguousarray(gu[:, :, 1, :].transpose(0, 2, 1))
    w2 = np.ascontiguousarray(dn.transpose(0, 2, 1))
    return w1, w3, w2
