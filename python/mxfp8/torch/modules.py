"""torch.nn modules: MXFP8Linear (a drop-in nn.Linear), convert_to_mxfp8 (swap a model's nn.Linear layers in place)
and BlockwiseMoE (a top-k routed Mixture-of-Experts feed-forward layer whose experts run through the mxfp8 MoE op).
"""

import math

import torch
from torch import nn

from .moe_ops import clamp_list, moe, numerics_lists, route, topk_softmax
from .ops import _autocast, linear
from .recipes import get_recipe

__all__ = ["MXFP8Linear", "convert_to_mxfp8", "BlockwiseMoE"]


class MXFP8Linear(nn.Linear):
    """nn.Linear whose three GEMMs run in MXFP8 (mxfp8.torch.linear): y = x @ weight^T + bias.

    Same constructor, parameters (.weight [out_features, in_features], .bias [out_features] or None), state dict
    and initialization as nn.Linear, plus `recipe` ("mxfp8" by default: E4M3 with the RCEIL scale rule; see
    mxfp8.torch.RECIPES). Input [..., in_features] of float32 / bfloat16 / float16 (under CPU autocast, the
    autocast dtype); output [..., out_features] in the input's dtype."""

    def __init__(self, in_features, out_features, bias=True, recipe="mxfp8", device=None, dtype=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.recipe = get_recipe(recipe)

    def forward(self, input):
        return linear(input, self.weight, self.bias, self.recipe)

    def extra_repr(self):
        return f"{super().extra_repr()}, recipe={self.recipe.name!r}"

    @classmethod
    def from_linear(cls, module, recipe="mxfp8"):
        """An MXFP8Linear sharing `module`'s weight and bias Parameters (no copy: optimizers and tied weights keep
        working)."""
        with torch.device("meta"):
            new = cls(module.in_features, module.out_features, bias=module.bias is not None, recipe=recipe)
        new.weight = module.weight
        new.bias = module.bias
        new.train(module.training)
        return new


def convert_to_mxfp8(model, recipe="mxfp8", filter_fn=None):
    """Swap every torch.nn.Linear of `model` (exactly that class: subclasses with their own forward are left alone)
    for an MXFP8Linear sharing its parameters, in place, as torchao's convert_to_float8_training does.

    recipe: a name in mxfp8.torch.RECIPES or an MXFP8Recipe. filter_fn(module, fqn) -> bool: convert only the
    layers it accepts (fqn is the module's fully qualified name, e.g. "layers.0.attn.qkv"); None converts all.
    Returns `model` (or the new module when `model` itself is an nn.Linear)."""
    r = get_recipe(recipe)

    def wanted(mod, fqn):
        return type(mod) is nn.Linear and (filter_fn is None or filter_fn(mod, fqn))

    if wanted(model, ""):
        return MXFP8Linear.from_linear(model, r)

    def swap(module, prefix):
        for name, child in list(module.named_children()):
            fqn = f"{prefix}.{name}" if prefix else name
            if wanted(child, fqn):
                setattr(module, name, MXFP8Linear.from_linear(child, r))
            else:
                swap(child, fqn)

    swap(model, "")
    return model


class BlockwiseMoE(nn.Module):
    """Top-k routed Mixture-of-Experts feed-forward layer with gated (SwiGLU-style) experts in MXFP8.

    hidden_size H, intermediate_size I (per expert), num_experts E, top_k experts per token; renormalize: divide
    the top_k router weights by their sum (as Mixtral); device, dtype: of the parameters, as for nn.Linear.

    forward(hidden_states [..., H]) -> output of the same shape and dtype (under CPU autocast: the autocast dtype):
      logits = router(x)                              router: nn.Linear(H, E, bias=False), weight [E, H]
      w, topk_ids = mxfp8.torch.topk_softmax(logits, top_k, renormalize): softmax in FP32 over the E experts, the
                    top_k largest (ties to the lower expert id), w /= w.sum() if renormalize (as Mixtral)
      token_position_to_id, block_to_expert, a = mxfp8.torch.route(topk_ids, w, E, block_size)
      output = mxfp8.torch.moe(x, a, gate_up_proj_weight, down_proj_weight, ...):
        per expert e chosen by token t: g = x @ W1[e][:, 0, :] (+ b1[e, 0]), u = x @ W1[e][:, 1, :] (+ b1[e, 1]),
        clamped by clamp_limits; output[t] += w * ((act(g) * u) @ W2[e] (+ b2[e]))
    The router's gradient flows through the affinities a (the moe op returns their gradient).

    Parameters (the NKI kernel's layouts): router.weight [E, H]; gate_up_proj_weight [E, H, 2, I] (index 0 of the
    third axis is the gate projection, 1 the up projection); down_proj_weight [E, I, H]; with bias=True also
    gate_and_up_proj_bias [E, 2, I] and down_proj_bias [E, H]. From the usual Mixtral / Hugging Face layout (per
    expert nn.Linear weights w1 = gate [I, H], w3 = up [I, H], w2 = down [H, I]; router "gate" [E, H]):
        gate_up_proj_weight[e, :, 0, :] = w1[e].T;  gate_up_proj_weight[e, :, 1, :] = w3[e].T
        down_proj_weight[e] = w2[e].T;              router.weight = gate.weight
    (load_mixtral_weights does exactly this; mxfp8.from_mixtral / mxfp8.to_mixtral map numpy arrays both ways).

    activation: "silu" (default), "swish" (x * sigmoid(1.702 x)), "squared_relu" or "gpt_oss_swiglu" (gpt-oss's
    clamped SwiGLU, (u + 1) g sigmoid(swiglu_alpha g) with g <= swiglu_limit, |u| <= swiglu_limit; defaults 1.702
    and 7). stochastic_rounding, rounding_seed: see mxfp8.torch.moe (set module.rounding_seed anew each step for
    independent rounding). clamp_limits: mxfp8.ClampLimits
    (or a dict of its fields): non_linear_* limits clip g, linear_* limits clip u. affinity_option: "affinity_on_i"
    or "affinity_on_h" (where the backward applies the affinity; same layer). recipe: "mxfp8" by default (E4M3 with
    the RCEIL rule), the default of every layer of mxfp8.torch; "nki" gives the NKI kernel's own defaults (E4M3,
    the NKI rule); see mxfp8.torch.RECIPES. block_size: positions per block (tokens of
    one expert are processed in blocks of this many; padding costs nothing beyond the last real position)."""

    def __init__(self, hidden_size, intermediate_size, num_experts, top_k, block_size=128, activation="silu",
                 bias=False, clamp_limits=None, affinity_option="affinity_on_i", recipe="mxfp8", renormalize=True,
                 device=None, dtype=None, swiglu_alpha=1.702, swiglu_limit=7.0, stochastic_rounding=None,
                 rounding_seed=0):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k: expected 1 <= top_k <= num_experts = {num_experts}, got {top_k}")
        if block_size < 1:
            raise ValueError(f"block_size: expected >= 1, got {block_size}")
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.num_experts, self.top_k, self.block_size = num_experts, top_k, block_size
        self.activation, self.affinity_option, self.renormalize = activation, affinity_option, renormalize
        self.clamp_limits = clamp_limits
        clamp_list(clamp_limits)  # validate now, not at the first forward
        self.swiglu_alpha, self.swiglu_limit = swiglu_alpha, swiglu_limit
        self.stochastic_rounding, self.rounding_seed = stochastic_rounding, rounding_seed
        numerics_lists(swiglu_alpha, swiglu_limit, stochastic_rounding, rounding_seed)
        self.recipe = get_recipe(recipe)
        kw = dict(device=device, dtype=dtype)
        E, H, I = num_experts, hidden_size, intermediate_size
        self.router = nn.Linear(H, E, bias=False, **kw)
        self.gate_up_proj_weight = nn.Parameter(torch.empty(E, H, 2, I, **kw))
        self.down_proj_weight = nn.Parameter(torch.empty(E, I, H, **kw))
        if bias:
            self.gate_and_up_proj_bias = nn.Parameter(torch.empty(E, 2, I, **kw))
            self.down_proj_bias = nn.Parameter(torch.empty(E, H, **kw))
        else:
            self.register_parameter("gate_and_up_proj_bias", None)
            self.register_parameter("down_proj_bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        """nn.Linear's initialization per expert projection: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = H
        for the gate/up projection (weight and bias) and I for the down projection; the router as nn.Linear."""
        self.router.reset_parameters()
        bh, bi = 1 / math.sqrt(self.hidden_size), 1 / math.sqrt(self.intermediate_size)
        nn.init.uniform_(self.gate_up_proj_weight, -bh, bh)
        nn.init.uniform_(self.down_proj_weight, -bi, bi)
        if self.gate_and_up_proj_bias is not None:
            nn.init.uniform_(self.gate_and_up_proj_bias, -bh, bh)
            nn.init.uniform_(self.down_proj_bias, -bi, bi)

    def route_tokens(self, x):
        """(topk_ids [T, top_k] int64, topk_weights [T, top_k] float32) of tokens x [T, H]."""
        w, ids = topk_softmax(self.router(x), self.top_k, self.renormalize)
        return ids, w

    def forward(self, hidden_states):
        shape = hidden_states.shape
        if hidden_states.dim() < 1 or shape[-1] != self.hidden_size:
            raise ValueError(f"hidden_states: last dimension must be hidden_size = {self.hidden_size}, got shape "
                             f"{tuple(shape)}")
        x = _autocast(hidden_states.reshape(-1, self.hidden_size))
        ids, w = self.route_tokens(x)
        tp, be, a = route(ids, w, self.num_experts, self.block_size)
        out = moe(x, a, self.gate_up_proj_weight, self.down_proj_weight, tp, be, self.block_size,
                  gate_and_up_proj_bias=self.gate_and_up_proj_bias, down_proj_bias=self.down_proj_bias,
                  activation=self.activation, clamp_limits=self.clamp_limits, affinity_option=self.affinity_option,
                  recipe=self.recipe, swiglu_alpha=self.swiglu_alpha, swiglu_limit=self.swiglu_limit,
                  stochastic_rounding=self.stochastic_rounding, rounding_seed=self.rounding_seed)
        return out.reshape(shape[:-1] + (self.hidden_size,))

    @torch.no_grad()
    def load_mixtral_weights(self, router_weight, w1, w3, w2):
        """Copy weights given in the Mixtral / Hugging Face layout: router_weight [E, H]; w1 (gate) and w3 (up):
        [E, I, H] tensors or sequences of E [I, H] tensors; w2 (down): [E, H, I] or E tensors [H, I] (nn.Linear
        weights, [out, in]). Returns self."""
        E, H, I = self.num_experts, self.hidden_size, self.intermediate_size
        w1, w3, w2 = (torch.stack(list(w)) if not isinstance(w, torch.Tensor) else w for w in (w1, w3, w2))
        for t, name, shape in ((router_weight, "router_weight", (E, H)), (w1, "w1", (E, I, H)),
                               (w3, "w3", (E, I, H)), (w2, "w2", (E, H, I))):
            if tuple(t.shape) != shape:
                raise ValueError(f"{name}: expected shape {shape}, got {tuple(t.shape)}")
        self.router.weight.copy_(router_weight)
        self.gate_up_proj_weight[:, :, 0, :].copy_(w1.transpose(1, 2))
        self.gate_up_proj_weight[:, :, 1, :].copy_(w3.transpose(1, 2))
        self.down_proj_weight.copy_(w2.transpose(1, 2))
        return self

    def extra_repr(self):
        return (f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
                f"num_experts={self.num_experts}, top_k={self.top_k}, block_size={self.block_size}, "
                f"activation={self.activation!r}, bias={self.gate_and_up_proj_bias is not None}, "
                f"affinity_option={self.affinity_option!r}, recipe={self.recipe.name!r}")
