"""Routing helpers of MoE training that need no library call: the auxiliary load-balancing loss."""

import torch

__all__ = ["load_balancing_loss"]


def load_balancing_loss(router_logits, num_experts, top_k, attention_mask=None):
    """The auxiliary load-balancing loss of Switch Transformer (Fedus et al. 2021, equations 4-6) as transformers
    computes it (load_balancing_loss_func of its MoE models): with p = softmax(logits) over the E experts and the
    top_k experts of each row, f_e = (rows choosing e) / rows and P_e = mean of p[:, e] over the rows (of all the
    layers together; rows weighted by attention_mask [batch, seq] when given), loss = E * sum_e f_e * P_e.
    router_logits: a tensor [rows, E] or a tuple / list of them (one per layer, as outputs.router_logits).
    Returns a 0-d float32 tensor (0 for None or an empty sequence, as transformers)."""
    if router_logits is None:
        return 0
    if isinstance(router_logits, torch.Tensor):
        router_logits = (router_logits,)
    router_logits = tuple(router_logits)
    if not router_logits:
        return 0
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
