"""torch.nn modules: MXFP8Linear (a drop-in nn.Linear), convert_to_mxfp8 (swap a model's nn.Linear layers in place)
and BlockwiseMoE (a top-k routed Mixture-of-Experts feed-forward layer whose experts run through the mxfp8 MoE op).
"""

import logging
import math
import sys
import warnings

import torch
from torch import nn

from . import moe_ops as _mo
from .moe_ops import clamp_list, moe, numerics_lists, route, router_linear, topk_softmax
from .ops import _autocast, linear
from .recipes import get_recipe
from .routing import select_experts

__all__ = ["MXFP8Linear", "convert_to_mxfp8", "BlockwiseMoE"]

_log = logging.getLogger("mxfp8.torch")


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


def _is_router(parent, name, child):
    """A router or gate of a MoE layer (kept in its own precision by convert_to_mxfp8 unless asked): BlockwiseMoE's
    router, and the layers transformers' MoE models name "router", "gate" or "*_gate" (Qwen2-MoE's
    shared_expert_gate); transformers 5's own routers are *TopKRouter modules with raw parameters, no nn.Linear."""
    return (isinstance(parent, BlockwiseMoE) and name == "router") or name in ("router", "gate") or \
        name.endswith("_gate")


def convert_to_mxfp8(model, recipe="mxfp8", filter_fn=None, *, quantize_routers=False, experts=True,
                     block_size=None, return_summary=False):
    """Convert `model` to MXFP8 training in place, as torchao's convert_to_float8_training does: every torch.nn.Linear
    (exactly that class: subclasses with their own forward are left alone) becomes an MXFP8Linear sharing its
    parameters, and the experts of a Hugging Face transformers (5.x) MoE model run through mxfp8.torch.moe (the
    "mxfp8" experts implementation of mxfp8.torch.hf, reading the fused expert parameters in place).

    recipe: a name in mxfp8.torch.RECIPES or an MXFP8Recipe (linear layers and experts). filter_fn(module, fqn) ->
    bool: convert only the layers / experts modules it accepts (fqn is the module's fully qualified name, e.g.
    "layers.0.attn.qkv"); None converts all. quantize_routers: also convert the routers and gates of MoE layers
    (BlockwiseMoE.router, nn.Linear layers named "router", "gate" or "*_gate"; transformers' router modules hold
    raw parameters and stay in torch, with a UserWarning when quantize_routers asks otherwise); False by default,
    because MXFP8 routers change the top-k choice of a few percent of the tokens. The experts implementation is
    set on the model's config, which transformers shares with the config object the model was built from. experts: convert transformers' experts modules
    (an unsupported one, or a model whose experts cannot all be converted, is left in torch with a UserWarning
    naming the reason). block_size: the experts' block size (mxfp8.torch.hf.DEFAULT_BLOCK_SIZE when None).
    state_dict keys and values are unchanged: checkpoints load into the converted and the unconverted model alike.

    Returns `model` (or the new module when `model` itself is an nn.Linear); with return_summary=True the pair
    (model, summary), summary a dict {"linear": [fqn...], "experts": [fqn...], "kept": {fqn: reason}}. The summary
    is also logged at INFO level on the logger "mxfp8.torch"."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if block_size is not None:
        _check_int("block_size", block_size, 1)
    if filter_fn is not None and not callable(filter_fn):
        raise TypeError(f"filter_fn: expected a callable filter_fn(module, fqn) -> bool, got {type(filter_fn).__name__}")
    r = get_recipe(recipe)
    summary = {"linear": [], "experts": [], "kept": {}}

    def accepted(mod, fqn):
        return filter_fn is None or filter_fn(mod, fqn)

    def finish(result):
        _log.info("convert_to_mxfp8: %d linear layers and %d experts modules in MXFP8 (recipe %s); kept in "
                  "torch: %s", len(summary["linear"]), len(summary["experts"]), r.name,
                  ", ".join(f"{k} ({v})" for k, v in summary["kept"].items()) or "none")
        return (result, summary) if return_summary else result

    if type(model) is nn.Linear and accepted(model, ""):
        summary["linear"].append("")
        return finish(MXFP8Linear.from_linear(model, r))

    def swap(module, prefix):
        for name, child in list(module.named_children()):
            fqn = f"{prefix}.{name}" if prefix else name
            if type(child) is nn.Linear:
                if _is_router(module, name, child) and not quantize_routers:
                    summary["kept"][fqn] = "router / gate (quantize_routers=False)"
                elif accepted(child, fqn):
                    setattr(module, name, MXFP8Linear.from_linear(child, r))
                    summary["linear"].append(fqn)
                else:
                    summary["kept"][fqn] = "filter_fn"
            elif type(child).__name__.lower().endswith("router") and "transformers" in type(child).__module__:
                summary["kept"][fqn] = "router of a transformers MoE block (raw parameters, computed in torch)"
                if quantize_routers:
                    warnings.warn(f"convert_to_mxfp8: quantize_routers=True, but {fqn} ({type(child).__name__}) "
                                  "holds raw parameters, not an nn.Linear: it stays in torch", UserWarning,
                                  stacklevel=3)
            else:
                swap(child, fqn)

    swap(model, "")
    if experts and "transformers" in sys.modules:
        _convert_hf_experts(model, r, filter_fn, block_size, summary)
    return finish(model)


def _convert_hf_experts(model, recipe, filter_fn, block_size, summary):
    """Select the "mxfp8" experts implementation of a transformers model when all its experts modules support it
    (mxfp8.torch.hf), configured with `recipe` / `block_size`; record what was done in `summary`."""
    from . import hf

    found = [(fqn, m) for fqn, m in model.named_modules() if hf.is_experts_module(m)]
    if not found:
        return
    problems = {}
    for fqn, m in found:
        if filter_fn is not None and not filter_fn(m, fqn):
            problems[fqn] = "filter_fn"
            continue
        try:
            hf.check_experts(m)
        except ValueError as e:
            problems[fqn] = str(e)
    if problems:
        # one experts implementation per model config: a partial conversion is not possible
        for fqn, _ in found:
            summary["kept"][fqn] = problems.get(fqn, "another experts module of the model cannot be converted")
        if any(v != "filter_fn" for v in problems.values()):  # not when filter_fn alone declined them
            warnings.warn("convert_to_mxfp8: the MoE experts stay in torch: " +
                          "; ".join(f"{k}: {v}" for k, v in problems.items()), UserWarning, stacklevel=3)
        return
    for fqn, m in found:
        m.mxfp8_recipe = recipe
        m.mxfp8_block_size = hf.DEFAULT_BLOCK_SIZE if block_size is None else block_size
        summary["experts"].append(fqn)
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(hf.IMPLEMENTATION)
    else:  # a bare transformers module (e.g. one MoE block): the config each experts module dispatches on
        for _, m in found:
            m.config._experts_implementation = hf.IMPLEMENTATION


def _check_int(name, v, lo):
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"{name}: expected an int >= {lo}, got {v!r}")


def _check_bool(name, v):
    if not (isinstance(v, bool) or (isinstance(v, int) and v in (0, 1))):
        raise TypeError(f"{name}: expected True or False, got {v!r}")


_ACTIVATION_ALIASES = {"quick_gelu": "swish"}  # transformers' name of x * sigmoid(1.702 x), the NKI "swish"
_TORCH_ACT = {"silu": torch.nn.functional.silu, "swish": lambda g: g * torch.sigmoid(1.702 * g),
              "squared_relu": lambda g: torch.relu(g) ** 2}


class _GatedMLP(nn.Module):
    """Shared experts: down_proj(act(gate_proj(x)) * up_proj(x)) with nn.Linear layers (no bias), as transformers'
    Qwen2-MoE / DeepSeek-V3 shared expert MLP (convert_to_mxfp8 makes them MXFP8Linear)."""

    def __init__(self, hidden_size, intermediate_size, activation, device=None, dtype=None):
        super().__init__()
        kw = dict(bias=False, device=device, dtype=dtype)
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, **kw)
        self.activation = activation

    def forward(self, x):
        return self.down_proj(_TORCH_ACT[self.activation](self.gate_proj(x)) * self.up_proj(x))


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

    Router variants (mxfp8.torch.routing.select_experts; the defaults are Mixtral's router above, through
    topk_softmax): score_func "softmax" or "sigmoid" (DeepSeek-V3); renormalize on or off; router_bias=True gives
    router a bias (gpt-oss: with softmax and renormalize, the softmax over the top-k logits);
    score_correction_bias=True adds the FP32 buffer e_score_correction_bias [E] to the scores for the choice only
    (DeepSeek-V3; it is a buffer, set by the training loop, no gradient); n_group / topk_group: group-limited top-k
    (the experts in n_group groups of consecutive ids, only the topk_group groups with the largest sum of their two
    best scores eligible); routed_scaling_factor multiplies the final weights. Shared experts (Qwen2-MoE,
    DeepSeek-V3): num_shared_experts >= 1 adds shared_experts, a gated MLP of nn.Linear layers gate_proj / up_proj
    [num_shared_experts * shared_intermediate_size (default intermediate_size), H] and down_proj, the same
    activation, run on every token and added to the output; shared_expert_gate=True scales it by
    sigmoid(shared_expert_gate(x)) (nn.Linear(H, 1), Qwen2-MoE). output_router_logits=True: forward returns
    (output, router_logits [T, E]) for the auxiliary loss (mxfp8.torch.load_balancing_loss).

    batch_invariant_router=True computes the router logits with mxfp8.torch.router_linear(x, router.weight,
    router.bias) instead of router(x): each logit is one FP32 fused multiply-add chain over the hidden size, so a
    token's logits -- and the experts it is routed to -- are bitwise the same whatever other tokens share its batch
    and whatever the thread count (nn.Linear's BLAS GEMM sums in an order that depends on the number of rows and the
    threads). Use it where routing must not depend on how the batch is split: expert parallelism, batch-invariant
    inference. The logits are then float32 (also under autocast; with router(x) they have x's dtype), and the
    input gradient through the router is batch-invariant too. The parameters stay router (an nn.Linear), so state
    dicts are the same either way.

    Expert parallelism: expert_parallel_group=pg (a torch.distributed ProcessGroup of the gloo or MPI backend)
    splits the experts over the P <= E ranks of pg in contiguous ranges (mxfp8.torch.expert_parallel.expert_range;
    E % P may be nonzero): this module then holds only its experts, gate_up_proj_weight [E_local, H, 2, I] and so on,
    at expert_range = (first expert, E_local); the router and shared experts are replicated and run on this rank's
    tokens; forward and backward are collective (every rank of pg calls them, in the same order). Each token row goes
    to the ranks owning its experts and the results come back through the group's all-to-all, with the rows in their
    own dtype on the wire (expert_parallel_wire="native", BF16 for a BF16 model or under autocast), rounded to BF16
    ("bf16") or as MXFP8 codes and E8M0 scales ("mxfp8": about half the bytes of BF16; the expert inputs and output
    gradients are then the rows' MX round trip, the router and shared experts see the unquantized rows).
    batch_invariant_router is turned on, so outputs, input gradients, router logits and their gradients and the
    expert weight gradients are bitwise equal to BlockwiseMoE(batch_invariant_router=True) on the batch gathered
    from all ranks in rank order (for the "mxfp8" and "bf16" wires: with that round trip applied), for any P and
    any tokens per rank (none included); a token's experts' results are summed in ascending expert order in FP32
    and rounded once, as in one process. Built after the same torch.manual_seed, every rank holds the experts of
    the single-process layer (reset_parameters draws them all and keeps its own). The router weight (and
    shared experts) are data-parallel: sum their gradients over the ranks (expert_parallel.all_reduce_dense_gradients;
    those bits depend on P and the token split). Shared experts are nn.Linear layers (torch's GEMM): their rows are
    not batch-invariant unless converted to MXFP8Linear. A bad input or a configuration differing between ranks
    raises the same ExpertParallelError on every rank before any exchange; a rank that never calls the layer leaves
    the others waiting until pg's timeout. Checkpoints: expert_parallel.gather_experts_state_dict /
    split_experts_state_dict. Not with stochastic_rounding, torch.compile or the transformers conversions (from_hf /
    to_hf). expert_parallel_stats holds the bytes each exchange of the last forward / backward moved.

    activation: "silu" (default), "swish" (x * sigmoid(1.702 x), the NKI name; transformers calls it "quick_gelu",
    also accepted here -- transformers' own "swish" is SiLU, "silu" here), "squared_relu" or "gpt_oss_swiglu" (gpt-oss's
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
                 rounding_seed=0, score_func="softmax", router_bias=False, score_correction_bias=False, n_group=1,
                 topk_group=1, routed_scaling_factor=1.0, num_shared_experts=0, shared_intermediate_size=None,
                 shared_expert_gate=False, output_router_logits=False, batch_invariant_router=False,
                 expert_parallel_group=None, expert_parallel_wire="native"):
        super().__init__()
        group = expert_parallel_group
        if group is not None:
            from . import expert_parallel as _ep
            _ep._check_group(group)  # without a usable group no rank can agree with the others
        err = None
        try:
            self._build(hidden_size, intermediate_size, num_experts, top_k, block_size, activation, bias,
                        clamp_limits, affinity_option, recipe, renormalize, device, dtype, swiglu_alpha, swiglu_limit,
                        stochastic_rounding, rounding_seed, score_func, router_bias, score_correction_bias, n_group,
                        topk_group, routed_scaling_factor, num_shared_experts, shared_intermediate_size,
                        shared_expert_gate, output_router_logits, batch_invariant_router, group,
                        expert_parallel_wire)
        except Exception as e:
            if group is None:
                raise
            err = e
        if group is not None:  # every rank raises the same error: a bad argument or a configuration differing
            _ep._agree(group, err, None if err else self._expert_parallel_config(),
                       "BlockwiseMoE(expert_parallel_group=...)")

    def _build(self, hidden_size, intermediate_size, num_experts, top_k, block_size, activation, bias, clamp_limits,
               affinity_option, recipe, renormalize, device, dtype, swiglu_alpha, swiglu_limit, stochastic_rounding,
               rounding_seed, score_func, router_bias, score_correction_bias, n_group, topk_group,
               routed_scaling_factor, num_shared_experts, shared_intermediate_size, shared_expert_gate,
               output_router_logits, batch_invariant_router, group, wire):
        for name, v, lo in (("hidden_size", hidden_size, 1), ("intermediate_size", intermediate_size, 1),
                            ("num_experts", num_experts, 1), ("top_k", top_k, 1), ("block_size", block_size, 1),
                            ("n_group", n_group, 1), ("topk_group", topk_group, 1),
                            ("num_shared_experts", num_shared_experts, 0)):
            _check_int(name, v, lo)
        if shared_intermediate_size is not None:
            _check_int("shared_intermediate_size", shared_intermediate_size, 1)
        for name, v in (("bias", bias), ("renormalize", renormalize), ("router_bias", router_bias),
                        ("score_correction_bias", score_correction_bias), ("shared_expert_gate", shared_expert_gate),
                        ("output_router_logits", output_router_logits),
                        ("batch_invariant_router", batch_invariant_router)):
            _check_bool(name, v)
        if isinstance(routed_scaling_factor, bool) or not isinstance(routed_scaling_factor, (int, float)) or \
                not math.isfinite(routed_scaling_factor) or routed_scaling_factor <= 0:
            raise ValueError(f"routed_scaling_factor: expected a finite number > 0, got {routed_scaling_factor!r}")
        if isinstance(activation, str):  # the library's names (its message lists them), checked now, not at forward
            _mo._canonical(_mo._mx.ACTIVATIONS, _mo._ACTIVATIONS, _mo._ACT_NAMES,
                           _ACTIVATION_ALIASES.get(activation.strip().lower(), activation), "activation")
        else:
            raise TypeError(f"activation: expected a name, got {type(activation).__name__}")
        _mo._canonical(_mo._mx.AFFINITY, _mo._AFFINITY, _mo._AFF_NAMES, affinity_option, "affinity_option")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k: expected 1 <= top_k <= num_experts = {num_experts}, got {top_k}")
        if block_size < 1:
            raise ValueError(f"block_size: expected >= 1, got {block_size}")
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.num_experts, self.top_k, self.block_size = num_experts, top_k, block_size
        activation = _ACTIVATION_ALIASES.get(activation.strip().lower(), activation) \
            if isinstance(activation, str) else activation
        self.activation, self.affinity_option, self.renormalize = activation, affinity_option, renormalize
        self.score_func, self.n_group, self.topk_group = score_func, n_group, topk_group
        self.routed_scaling_factor, self.output_router_logits = float(routed_scaling_factor), output_router_logits
        self.batch_invariant_router = bool(batch_invariant_router)
        self.clamp_limits = clamp_limits
        clamp_list(clamp_limits)  # validate now, not at the first forward
        self.swiglu_alpha, self.swiglu_limit = swiglu_alpha, swiglu_limit
        self.stochastic_rounding, self.rounding_seed = stochastic_rounding, rounding_seed
        numerics_lists(swiglu_alpha, swiglu_limit, stochastic_rounding, rounding_seed)
        self.recipe = get_recipe(recipe)
        kw = dict(device=device, dtype=dtype)
        E, H, I = num_experts, hidden_size, intermediate_size
        self.expert_parallel_group, self.expert_parallel_wire = group, None
        self.expert_range = (0, E)  # (first expert, number of experts) held by this module
        self.expert_parallel_stats = {}
        if group is not None:
            from . import expert_parallel as _ep
            if stochastic_rounding:
                raise ValueError("stochastic_rounding: not available with expert parallelism (an element's random "
                                 "word comes from its position in the whole batch, which a rank's experts do not "
                                 "see)")
            self.expert_parallel_wire = _ep._check_wire(wire)
            self.batch_invariant_router = True  # each token's routing must not depend on the rank's batch
            self.expert_range = _ep.expert_range(E, torch.distributed.get_world_size(group),
                                               torch.distributed.get_rank(group))
        E_local = self.expert_range[1]
        self.router = nn.Linear(H, E, bias=router_bias, **kw)
        if score_correction_bias:
            self.register_buffer("e_score_correction_bias", torch.zeros(E, device=device, dtype=torch.float32))
        else:
            self.e_score_correction_bias = None
        # check the router options now, not at the first forward
        select_experts(torch.zeros(1, E), top_k, score_func=score_func, n_group=n_group, topk_group=topk_group)
        if num_shared_experts:
            if activation not in _TORCH_ACT:
                raise ValueError(f"shared experts: activation {activation!r} is not one of {', '.join(_TORCH_ACT)}")
            si = (shared_intermediate_size or intermediate_size) * num_shared_experts
            self.shared_experts = _GatedMLP(H, si, activation, **kw)
            self.shared_expert_gate = nn.Linear(H, 1, bias=False, **kw) if shared_expert_gate else None
        else:
            if shared_expert_gate:
                raise ValueError("shared_expert_gate: needs num_shared_experts >= 1")
            self.shared_experts = self.shared_expert_gate = None
        self.gate_up_proj_weight = nn.Parameter(torch.empty(E_local, H, 2, I, **kw))
        self.down_proj_weight = nn.Parameter(torch.empty(E_local, I, H, **kw))
        if bias:
            self.gate_and_up_proj_bias = nn.Parameter(torch.empty(E_local, 2, I, **kw))
            self.down_proj_bias = nn.Parameter(torch.empty(E_local, H, **kw))
        else:
            self.register_parameter("gate_and_up_proj_bias", None)
            self.register_parameter("down_proj_bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        """nn.Linear's initialization per expert projection: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = H
        for the gate/up projection (weight and bias) and I for the down projection; the router as nn.Linear. Under
        expert parallelism each rank draws the whole layer's values and keeps its experts', so that ranks seeded
        alike hold the experts of one process's layer built from that seed."""
        self.router.reset_parameters()
        for m in (self.shared_experts, self.shared_expert_gate):
            if m is not None:
                for lin in m.modules():
                    if isinstance(lin, nn.Linear):
                        lin.reset_parameters()
        bh, bi = 1 / math.sqrt(self.hidden_size), 1 / math.sqrt(self.intermediate_size)
        e0, n = self.expert_range
        for t, b in ((self.gate_up_proj_weight, bh), (self.down_proj_weight, bi), (self.gate_and_up_proj_bias, bh),
                     (self.down_proj_bias, bi)):
            if t is None:
                continue
            if n == self.num_experts or t.is_meta:
                nn.init.uniform_(t, -b, b)
            else:  # expert parallelism: this rank's slice of the whole layer's draw (same seed, same experts)
                with torch.no_grad():
                    t.copy_(nn.init.uniform_(t.new_empty((self.num_experts,) + tuple(t.shape[1:])), -b, b)[e0:e0 + n])

    def route_tokens(self, x):
        """(topk_ids [T, top_k] int64, topk_weights [T, top_k] float32) of tokens x [T, H]."""
        return self._route(self._router_logits(x))[:2]

    def _router_logits(self, x):
        """The router logits [T, E] of tokens x [T, H]: router(x), or with batch_invariant_router the float32
        logits of mxfp8.torch.router_linear (each row's bits independent of the batch)."""
        if self.batch_invariant_router:
            return router_linear(x, self.router.weight, self.router.bias)
        return self.router(x)

    def _route(self, logits):
        if (self.score_func == "softmax" and self.e_score_correction_bias is None and self.n_group == 1
                and self.routed_scaling_factor == 1.0):
            w, ids = topk_softmax(logits, self.top_k, self.renormalize)
        else:
            w, ids = select_experts(logits, self.top_k, score_func=self.score_func, renormalize=self.renormalize,
                                    score_correction_bias=self.e_score_correction_bias, n_group=self.n_group,
                                    topk_group=self.topk_group, routed_scaling_factor=self.routed_scaling_factor)
        return ids, w, logits

    def _check_input(self, hidden_states):
        shape = hidden_states.shape
        if hidden_states.dim() < 1 or shape[-1] != self.hidden_size:
            raise ValueError(f"hidden_states: last dimension must be hidden_size = {self.hidden_size}, got shape "
                             f"{tuple(shape)}")
        return shape, _autocast(hidden_states.reshape(-1, self.hidden_size))

    def forward(self, hidden_states):
        if self.expert_parallel_group is not None:
            return self._forward_expert_parallel(hidden_states)
        shape, x = self._check_input(hidden_states)
        ids, w, logits = self._route(self._router_logits(x))
        tp, be, a = route(ids, w, self.num_experts, self.block_size)
        out = moe(x, a, self.gate_up_proj_weight, self.down_proj_weight, tp, be, self.block_size,
                  gate_and_up_proj_bias=self.gate_and_up_proj_bias, down_proj_bias=self.down_proj_bias,
                  activation=self.activation, clamp_limits=self.clamp_limits, affinity_option=self.affinity_option,
                  recipe=self.recipe, swiglu_alpha=self.swiglu_alpha, swiglu_limit=self.swiglu_limit,
                  stochastic_rounding=self.stochastic_rounding, rounding_seed=self.rounding_seed)
        return self._finish(x, out, shape, w, logits)

    def _forward_expert_parallel(self, hidden_states):
        """forward with the experts split over expert_parallel_group (mxfp8.torch.expert_parallel): routing on this
        rank's tokens, dispatch, the local experts, combine; local errors are agreed by every rank first."""
        from . import expert_parallel as _ep

        err = x = ids = w = logits = shape = None
        try:
            shape, x = self._check_input(hidden_states)
            ids, w, logits = self._route(self._router_logits(x))
        except Exception as e:  # agreed inside expert_parallel_moe: every rank raises the same error
            err = e
        self.expert_parallel_stats = {}
        out = _ep.expert_parallel_moe(
            x, ids, w, self.gate_up_proj_weight, self.down_proj_weight, self.num_experts, self.expert_parallel_group,
            block_size=self.block_size, wire=self.expert_parallel_wire,
            gate_and_up_proj_bias=self.gate_and_up_proj_bias, down_proj_bias=self.down_proj_bias,
            activation=self.activation, clamp_limits=self.clamp_limits, affinity_option=self.affinity_option,
            recipe=self.recipe, swiglu_alpha=self.swiglu_alpha, swiglu_limit=self.swiglu_limit,
            stats=self.expert_parallel_stats, config=self._expert_parallel_config(), local_error=err)
        return self._finish(x, out, shape, w, logits)

    def _expert_parallel_config(self):
        """The configuration every rank of an expert-parallel layer must share (compared field by field)."""
        sh = self.shared_experts
        return dict(num_experts=self.num_experts, hidden_size=self.hidden_size,
                    intermediate_size=self.intermediate_size, top_k=self.top_k, block_size=self.block_size,
                    activation=self.activation, bias=self.gate_and_up_proj_bias is not None,
                    clamp_limits=clamp_list(self.clamp_limits), affinity_option=self.affinity_option,
                    recipe=(self.recipe.name, str(self.recipe.moe_dtype), self.recipe.scale_rule),
                    renormalize=bool(self.renormalize), score_func=self.score_func,
                    router_bias=self.router.bias is not None,
                    score_correction_bias=self.e_score_correction_bias is not None, n_group=self.n_group,
                    topk_group=self.topk_group, routed_scaling_factor=self.routed_scaling_factor,
                    shared_experts=None if sh is None else tuple(sh.gate_proj.weight.shape),
                    shared_expert_gate=self.shared_expert_gate is not None,
                    swiglu=(float(self.swiglu_alpha), float(self.swiglu_limit)),
                    expert_parallel_wire=self.expert_parallel_wire,
                    parameter_dtype=str(self.gate_up_proj_weight.dtype))

    def _finish(self, x, out, shape, w, logits):
        if self.shared_experts is not None:
            sh = self.shared_experts(x)
            if self.shared_expert_gate is not None:
                sh = torch.sigmoid(self.shared_expert_gate(x)) * sh
            out = out + sh.to(out.dtype)
        out = out.reshape(shape[:-1] + (self.hidden_size,))
        if getattr(self, "_returns_router_scores", False):  # built from gpt-oss's GptOssMLP: what it returns
            return out, w
        return (out, logits) if self.output_router_logits else out

    @classmethod
    def from_hf(cls, block, recipe="mxfp8", block_size=128):
        """A BlockwiseMoE equivalent to the Hugging Face transformers (5.x) MoE block `block` (weights copied): the
        sparse MoE blocks of Mixtral, Qwen2-MoE (with its shared expert and sigmoid gate), Qwen3-MoE, OLMoE,
        DeepSeek-V3 (sigmoid router, score-correction bias, group-limited top-k, routed scaling factor, shared
        experts) and gpt-oss's GptOssMLP (router bias, clamped SwiGLU, expert biases; forward then returns
        (output, router_scores) as GptOssMLP does). Its forward returns what the block's returns, so it can replace
        the block in a model (transformers' output_router_logits recording needs its own router modules: keep the
        block and use model.set_experts_implementation("mxfp8") for that). ValueError naming the class for any
        other block. to_hf writes the weights back."""
        from . import hf

        name = type(block).__name__
        experts = getattr(block, "experts", None)
        router = getattr(block, "gate", None) or getattr(block, "router", None)
        if experts is None or router is None or not hf.is_experts_module(experts):
            raise ValueError(f"from_hf: {name} is not a supported transformers MoE block (expected one with "
                             f".experts and .gate or .router)")
        act = hf.check_experts(experts)
        w1, w2, b1, b2 = hf.experts_views(experts)
        E, H, _, I = w1.shape
        kw = dict(activation=act, bias=b1 is not None, recipe=recipe, block_size=block_size,
                  device=w1.device, dtype=w1.dtype)
        if act == "gpt_oss_swiglu":
            kw.update(swiglu_alpha=float(experts.alpha), swiglu_limit=float(experts.limit))
        rname = type(router).__name__
        if rname == "DeepseekV3TopkRouter":
            kw.update(score_func="sigmoid", score_correction_bias=True, n_group=router.num_group,
                      topk_group=router.topk_group, routed_scaling_factor=router.routed_scaling_factor,
                      renormalize=router.norm_topk_prob)
        elif rname == "GptOssTopKRouter":
            kw.update(router_bias=True, renormalize=True)
        elif rname in ("MixtralTopKRouter", "Qwen2MoeTopKRouter", "Qwen3MoeTopKRouter", "OlmoeTopKRouter"):
            kw.update(renormalize=getattr(router, "norm_topk_prob", True))
        else:
            raise ValueError(f"from_hf: the router {rname} of {name} is not supported")
        shared = getattr(block, "shared_experts", None) or getattr(block, "shared_expert", None)
        if shared is not None:
            kw.update(num_shared_experts=1, shared_intermediate_size=shared.gate_proj.out_features,
                      shared_expert_gate=getattr(block, "shared_expert_gate", None) is not None)
        new = cls(H, I, E, router.top_k, **kw)
        new._returns_router_scores = name == "GptOssMLP"
        new._hf_copy(block, to_hf=False)
        new.train(block.training)
        return new

    def to_hf(self, block):
        """Write this module's weights back into the transformers MoE block `block` (of the class and shapes it was
        built from with from_hf), in place; returns block."""
        self._hf_copy(block, to_hf=True)
        return block

    @torch.no_grad()
    def _hf_copy(self, block, to_hf):
        from . import hf

        if self.expert_parallel_group is not None:
            raise ValueError("to_hf: this BlockwiseMoE holds only its rank's experts (expert_parallel_group); gather "
                             "them first (mxfp8.torch.expert_parallel.gather_experts_state_dict)")
        w1, w2, b1, b2 = hf.experts_views(block.experts)
        router = getattr(block, "gate", None) or getattr(block, "router", None)
        pairs = [(w1, self.gate_up_proj_weight), (w2, self.down_proj_weight), (router.weight, self.router.weight)]
        if b1 is not None:
            pairs += [(b1, self.gate_and_up_proj_bias), (b2, self.down_proj_bias)]
        if getattr(router, "bias", None) is not None:
            pairs.append((router.bias, self.router.bias))
        if getattr(router, "e_score_correction_bias", None) is not None:
            pairs.append((router.e_score_correction_bias, self.e_score_correction_bias))
        shared = getattr(block, "shared_experts", None) or getattr(block, "shared_expert", None)
        if shared is not None:
            for n in ("gate_proj", "up_proj", "down_proj"):
                pairs.append((getattr(shared, n).weight, getattr(self.shared_experts, n).weight))
            if getattr(block, "shared_expert_gate", None) is not None:
                pairs.append((block.shared_expert_gate.weight, self.shared_expert_gate.weight))
        for theirs, ours in pairs:
            if tuple(theirs.shape) != tuple(ours.shape):
                raise ValueError(f"to_hf / from_hf: shape {tuple(ours.shape)} does not match {tuple(theirs.shape)}")
            (theirs if to_hf else ours).copy_(ours if to_hf else theirs)

    @torch.no_grad()
    def load_mixtral_weights(self, router_weight, w1, w3, w2):
        """Copy weights given in the Mixtral / Hugging Face layout: router_weight [E, H]; w1 (gate) and w3 (up):
        [E, I, H] tensors or sequences of E [I, H] tensors; w2 (down): [E, H, I] or E tensors [H, I] (nn.Linear
        weights, [out, in]); all E experts also under expert parallelism (this rank copies its own). Returns self."""
        E, H, I = self.num_experts, self.hidden_size, self.intermediate_size
        w1, w3, w2 = (torch.stack(list(w)) if not isinstance(w, torch.Tensor) else w for w in (w1, w3, w2))
        for t, name, shape in ((router_weight, "router_weight", (E, H)), (w1, "w1", (E, I, H)),
                               (w3, "w3", (E, I, H)), (w2, "w2", (E, H, I))):
            if tuple(t.shape) != shape:
                raise ValueError(f"{name}: expected shape {shape}, got {tuple(t.shape)}")
        e0, n = self.expert_range
        w1, w3, w2 = w1[e0:e0 + n], w3[e0:e0 + n], w2[e0:e0 + n]
        self.router.weight.copy_(router_weight)
        self.gate_up_proj_weight[:, :, 0, :].copy_(w1.transpose(1, 2))
        self.gate_up_proj_weight[:, :, 1, :].copy_(w3.transpose(1, 2))
        self.down_proj_weight.copy_(w2.transpose(1, 2))
        return self

    def extra_repr(self):
        return (f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
                f"num_experts={self.num_experts}, top_k={self.top_k}, block_size={self.block_size}, "
                f"activation={self.activation!r}, bias={self.gate_and_up_proj_bias is not None}, "
                f"affinity_option={self.affinity_option!r}, recipe={self.recipe.name!r}"
                + (", batch_invariant_router=True" if self.batch_invariant_router else "")
                + (f", expert_range={self.expert_range}, expert_parallel_wire={self.expert_parallel_wire!r}"
                   if self.expert_parallel_group is not None else ""))
