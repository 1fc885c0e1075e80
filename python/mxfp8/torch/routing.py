"""Routing helpers of MoE training that need no library call: the router variants of popular MoE models
(select_experts) and the auxiliary load-balancing loss."""

import operator

import torch

__all__ = ["load_balancing_loss", "select_experts"]


def _int_or_none(v):
    """v as a Python int when it is an integer (int, numpy or 0-d torch integer; not a bool), else None."""
    if isinstance(v, bool):
        return None
    try:
        return operator.index(v)
    except TypeError:
        return None


def load_balancing_loss(router_logits, num_experts, top_k, attention_mask=None):
    """The auxiliary load-balancing loss of Switch Transformer (Fedus et al. 2021, equations 4-6) as transformers
    computes it (load_balancing_loss_func of its MoE models): with p = softmax(logits) over the E experts and the
    top_k experts of each row, f_e = (rows choosing e) / rows and P_e = mean of p[:, e] over the rows (of all the
    layers together; rows weighted by attention_mask [batch, seq] when given), loss = E * sum_e f_e * P_e.
    router_logits: a tensor [rows, E] or a tuple / list of them (one per layer, as outputs.router_logits).
    num_experts: E, the number of experts (the logits' last extent). top_k: the experts each row chooses.
    attention_mask: None, or [batch, seq] of 0/1 (rows = batch * seq of each layer's logits).
    Returns a 0-d float32 tensor (0 for None or an empty sequence, as transformers)."""
    if router_logits is None:
        return 0
    if isinstance(router_logits, torch.Tensor):
        router_logits = (router_logits,)
    router_logits = tuple(router_logits)
    if not router_logits:
        return 0
    num_experts, top_k = _int_or_none(num_experts), _int_or_none(top_k)
    if num_experts is None or num_experts < 1:
        raise ValueError(f"num_experts: expected an int >= 1, got {num_experts!r}")
    if top_k is None or not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k: expected an int in [1, {num_experts}] (the number of experts), got {top_k!r}")
    for i, logits in enumerate(router_logits):  # checked before any work, with the layer named
        if not isinstance(logits, torch.Tensor) or logits.ndim != 2 or logits.shape[-1] != num_experts:
            got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise ValueError(f"router_logits[{i}]: expected a tensor [rows, num_experts = {num_experts}], got {got}")
    mask = None if attention_mask is None else attention_mask.reshape(-1).to(torch.float32)
    counts = torch.zeros(num_experts, dtype=torch.float32)
    probs = torch.zeros(num_experts, dtype=torch.float32)
    rows = 0.0
    for logits in router_logits:
        p = torch.softmax(logits.float(), dim=-1)
        chosen = torch.nn.functional.one_hot(torch.topk(p, top_k, dim=-1).indices, num_experts).sum(1).float()
        if mask is None:
            counts = counts + chosen.sum(0)
            probs = probs + p.sum(0)
            rows = rows + p.shape[0]
        else:
            counts = counts + (chosen * mask[:, None]).sum(0)
            probs = probs + (p * mask[:, None]).sum(0)
            rows = rows + mask.sum()
    return num_experts * torch.sum((counts / rows) * (probs / rows))


_SCORE_FUNCS = ("softmax", "sigmoid")


def select_experts(router_logits, top_k, *, score_func="softmax", renormalize=True, score_correction_bias=None,
                   n_group=1, topk_group=1, routed_scaling_factor=1.0):
    """The router of a top-k MoE in its popular variants, in FP32 torch ops, differentiable in router_logits
    (score_correction_bias only steers the choice and gets no gradient):
        scores = softmax(logits) over the E experts with score_func "softmax" (Mixtral, Qwen-MoE, OLMoE; with a
                 router bias in the logits, gpt-oss: softmax over the top-k logits is the renormalized softmax),
                 or sigmoid(logits) with score_func "sigmoid" (DeepSeek-V3)
        choice = scores + score_correction_bias (DeepSeek-V3's e_score_correction_bias; selection only)
        with n_group > 1 (group-limited top-k, DeepSeek-V3): the experts form n_group groups of E / n_group
        consecutive ids; a group's score is the sum of its two largest choice values (its largest when the group has
        one expert); only the topk_group best groups are eligible
        topk_ids = the top_k largest choice values (ties to the lower expert id); weights = scores at those ids,
        divided by their sum when renormalize, times routed_scaling_factor.
    router_logits [T, E] float; top_k in [1, E]. Returns (topk_weights [T, top_k] float32, topk_ids [T, top_k]
    int64, ids in descending order of choice). ValueError for a bad parameter."""
    if not isinstance(router_logits, torch.Tensor) or router_logits.dim() != 2:
        raise ValueError("router_logits: expected a 2-D tensor [T, E]")
    E = router_logits.shape[1]
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= E:
        raise ValueError(f"top_k: expected an int in [1, {E}] (the number of experts), got {top_k!r}")
    if score_func not in _SCORE_FUNCS:
        raise ValueError(f"score_func: expected one of {', '.join(_SCORE_FUNCS)}, got {score_func!r}")
    if not (isinstance(n_group, int) and n_group >= 1 and E % n_group == 0):
        raise ValueError(f"n_group: expected an int >= 1 dividing the {E} experts, got {n_group!r}")
    if not (isinstance(topk_group, int) and 1 <= topk_group <= n_group):
        raise ValueError(f"topk_group: expected an int in [1, n_group = {n_group}], got {topk_group!r}")
    if n_group > 1 and topk_group * (E // n_group) < top_k:
        raise ValueError(f"topk_group: {topk_group} groups of {E // n_group} experts cannot hold top_k = {top_k}")
    logits = router_logits.float()
    scores = torch.softmax(logits, dim=-1) if score_func == "softmax" else torch.sigmoid(logits)
    choice = scores.detach()
    if score_correction_bias is not None:
        if tuple(score_correction_bias.shape) != (E,):
            raise ValueError(f"score_correction_bias: expected shape ({E},), got "
                             f"{tuple(score_correction_bias.shape)}")
        choice = choice + score_correction_bias.detach().float()
    if n_group > 1:
        grouped = choice.view(-1, n_group, E // n_group)
        top2 = torch.sort(grouped, dim=-1, descending=True).values[..., :min(2, E // n_group)]
        gsel = torch.sort(top2.sum(-1), dim=-1, descending=True, stable=True).indices[:, :topk_group]
        keep = torch.zeros(choice.shape[0], n_group, dtype=torch.bool).scatter_(1, gsel, True)
        choice = choice.masked_fill(~keep.repeat_interleave(E // n_group, dim=1), float("-inf"))
    ids = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, :top_k].contiguous()
    w = scores.gather(1, ids)
    if renormalize:
        w = w / w.sum(dim=-1, keepdim=True)
    if routed_scaling_factor != 1.0:
        w = w * float(routed_scaling_factor)
    return w, ids
