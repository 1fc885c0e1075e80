"""mxfp8.torch.hf -- Hugging Face transformers (5.x) integration: the experts of transformers' MoE models in MXFP8.

    import mxfp8.torch.hf                       # registers "mxfp8" in transformers' ExpertsInterface
    model.set_experts_implementation("mxfp8")   # every experts module of the model now runs mxfp8.torch.moe
    mxfp8.torch.hf.configure(model, recipe="ocp", block_size=64)   # optional: recipe and block size per model

or, for the whole model (experts and dense layers), ``mxfp8.torch.convert_to_mxfp8(model, recipe="mxfp8")``.

transformers 5 stores the experts of a MoE block as fused 3-D parameters of one experts module (mlp.experts), called
through its ExpertsInterface as ``experts(hidden_states [T, H], top_k_index [T, K], top_k_weights [T, K])``. The
"mxfp8" implementation reads those parameters as strided views in the layout of mxfp8.torch.moe (no copy: the
gradients land in transformers' own parameters) and routes the chosen experts with mxfp8.torch.route:

    layout (the experts module's flags)        gate_up_proj       gate_up_proj_bias  down_proj   down_proj_bias
    concatenated, not transposed (Mixtral,     [E, 2I, H], gate   --                 [E, H, I]   --
      Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-V3) rows [:I] first
    interleaved, transposed, biases (gpt-oss)  [E, H, 2I], gate   [E, 2I],           [E, I, H]   [E, H]
                                               [..., ::2], up     interleaved
                                               [..., 1::2]
    (any other combination of is_concatenated / is_transposed / has_bias is read the same way.)

The routers (the *TopKRouter modules) stay in torch in their own precision: transformers computes top_k_index and
top_k_weights as usual, so every router semantics (softmax or sigmoid scores, group-limited top-k, score-correction
bias, routed scaling factor) and output_router_logits=True with the auxiliary load-balancing loss keep working.

Activations: the experts module's act_fn -- transformers' "silu" and "swish" (both SiLU, x * sigmoid(x)) run as the
library's "silu"; "quick_gelu" (x * sigmoid(1.702 x)) as the library's (NKI) "swish"; "relu2" as "squared_relu".
gpt-oss's clamped SwiGLU (its _apply_gate) runs as "gpt_oss_swiglu" with the module's own alpha and limit.
Not supported, with a ValueError naming the class: experts without a gate (has_gate=False), a post-expert norm,
transformers' own expert parallelism (_is_expert_parallel), any other activation or custom _apply_gate.
Expert parallelism of our own: ``mxfp8.torch.hf.shard_experts(model, group)`` splits every experts module's experts
over a torch.distributed group (gloo), bitwise equal to one process given the routing (see its docstring).

Importing this module imports transformers (ImportError with the install hint when it is missing); ``import
mxfp8.torch`` does not.
"""

import torch
from torch import nn

from .moe_ops import moe, route
from .ops import _autocast
from .recipes import get_recipe
from .routing import load_balancing_loss  # noqa: F401  (also here, beside the experts)

try:
    import transformers
    from transformers.integrations.moe import ExpertsInterface, _default_apply_gate
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("mxfp8.torch.hf needs Hugging Face transformers 5 (pip install 'transformers>=5,<6')") from e

__all__ = ["IMPLEMENTATION", "register", "configure", "shard_experts", "experts_forward", "is_experts_module",
           "check_experts",
           "experts_views", "load_balancing_loss", "DEFAULT_RECIPE", "DEFAULT_BLOCK_SIZE"]

IMPLEMENTATION = "mxfp8"
DEFAULT_RECIPE = "mxfp8"
DEFAULT_BLOCK_SIZE = 128

if int(transformers.__version__.split(".")[0]) < 5:  # pragma: no cover
    raise ImportError(f"mxfp8.torch.hf needs transformers 5 (fused experts), found {transformers.__version__}")


def _activation_name(module):
    """The library's activation name of a transformers experts module, or raise ValueError naming what it has."""
    if type(module)._apply_gate is not _default_apply_gate:
        if hasattr(module, "alpha") and hasattr(module, "limit") and type(module).__name__ == "GptOssExperts":
            return "gpt_oss_swiglu"
        raise ValueError(f"{type(module).__name__}: its gating (_apply_gate) is not one the mxfp8 experts "
                         f"implementation supports (the default act(gate) * up or gpt-oss's clamped SwiGLU)")
    from transformers import activations as A

    act = getattr(module, "act_fn", None)
    if isinstance(act, (nn.SiLU, A.SiLUActivation)):
        return "silu"
    if isinstance(act, A.QuickGELUActivation):
        return "swish"  # NKI's swish is x * sigmoid(1.702 x), transformers' quick_gelu
    if isinstance(act, A.ReLUSquaredActivation):
        return "squared_relu"
    raise ValueError(f"{type(module).__name__}: activation {type(act).__name__} is not supported by the mxfp8 "
                     f"experts implementation (supported: transformers' silu / swish, quick_gelu, relu2)")


def is_experts_module(module):
    """True for a transformers experts module dispatched through the ExpertsInterface (a class decorated with
    use_experts_implementation: it has the has_gate / is_concatenated / is_transposed flags)."""
    return all(hasattr(module, f) for f in ("has_gate", "is_concatenated", "is_transposed", "has_bias")) and \
        hasattr(module, "config")


def check_experts(module):
    """Raise ValueError naming the class when the mxfp8 implementation cannot run `module`; returns its activation
    name (the library's) otherwise."""
    name = type(module).__name__
    if not is_experts_module(module):
        raise ValueError(f"{name}: not a transformers experts module (no use_experts_implementation flags)")
    if not module.has_gate:
        raise ValueError(f"{name}: experts without a gate projection (has_gate=False, non-GLU MLP experts) are not "
                         f"supported: the MXFP8 MoE layer computes act(gate) * up")
    if getattr(module, "has_post_expert_norm", False):
        raise ValueError(f"{name}: a post-expert norm (has_post_expert_norm=True) is not supported")
    if getattr(module, "_is_expert_parallel", False):
        raise ValueError(f"{name}: transformers' expert parallelism is not supported by the mxfp8 experts "
                         f"implementation (use mxfp8.mpi for expert parallelism)")
    for p in ("gate_up_proj", "down_proj"):
        if not isinstance(getattr(module, p, None), torch.Tensor) or getattr(module, p).dim() != 3:
            raise ValueError(f"{name}: expected a 3-D parameter {p}")
    return _activation_name(module)


def experts_views(module):
    """(gate_up_proj_weight [E, H, 2, I], down_proj_weight [E, I, H], gate_and_up_proj_bias [E, 2, I] or None,
    down_proj_bias [E, H] or None): views of the experts module's fused parameters in mxfp8.torch.moe's layout
    (no copies; autograd carries the gradients back to the parameters)."""
    gu, dn = module.gate_up_proj, module.down_proj
    E = gu.shape[0]
    if module.is_transposed:  # gate_up_proj [E, H, 2I], down_proj [E, I, H]
        H, I = gu.shape[1], gu.shape[2] // 2
        if tuple(gu.shape) != (E, H, 2 * I) or tuple(dn.shape) != (E, I, H):
            raise ValueError(f"{type(module).__name__}: transposed experts: expected gate_up_proj [E, H, 2I] and "
                             f"down_proj [E, I, H], got {tuple(gu.shape)} and {tuple(dn.shape)}")
        w1 = gu.view(E, H, 2, I) if module.is_concatenated else gu.view(E, H, I, 2).transpose(2, 3)
        w2 = dn
    else:  # gate_up_proj [E, 2I, H], down_proj [E, H, I]
        H, I = gu.shape[2], gu.shape[1] // 2
        if tuple(gu.shape) != (E, 2 * I, H) or tuple(dn.shape) != (E, H, I):
            raise ValueError(f"{type(module).__name__}: expected gate_up_proj [E, 2I, H] and down_proj [E, H, I], "
                             f"got {tuple(gu.shape)} and {tuple(dn.shape)}")
        w1 = (gu.view(E, 2, I, H) if module.is_concatenated else gu.view(E, I, 2, H).transpose(1, 2))
        w1 = w1.permute(0, 3, 1, 2)
        w2 = dn.transpose(1, 2)
    b1 = b2 = None
    if module.has_bias:
        gb, db = module.gate_up_proj_bias, module.down_proj_bias
        if tuple(gb.shape) != (E, 2 * I) or tuple(db.shape) != (E, H):
            raise ValueError(f"{type(module).__name__}: expected gate_up_proj_bias [E, 2I] = {(E, 2 * I)} and "
                             f"down_proj_bias [E, H] = {(E, H)}, got {tuple(gb.shape)} and {tuple(db.shape)}")
        b1 = gb.view(E, 2, I) if module.is_concatenated else gb.view(E, I, 2).transpose(1, 2)
        b2 = db
    return w1, w2, b1, b2


def experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """The "mxfp8" experts implementation: out[t] = sum_k top_k_weights[t, k] * expert_{top_k_index[t, k]}(x[t]),
    through mxfp8.torch.route and mxfp8.torch.moe, with the module's recipe (attribute mxfp8_recipe, default
    DEFAULT_RECIPE) and block size (mxfp8_block_size, default DEFAULT_BLOCK_SIZE; see configure).
    hidden_states [T, H]; top_k_index [T, K] int; top_k_weights [T, K] float. Returns [T, H] in hidden_states'
    dtype (under CPU autocast: the autocast dtype)."""
    activation = check_experts(self)
    w1, w2, b1, b2 = experts_views(self)
    E = w1.shape[0]
    if hidden_states.dim() != 2 or hidden_states.shape[1] != w1.shape[1]:
        raise ValueError(f"{type(self).__name__}: hidden_states: expected [T, H={w1.shape[1]}], got "
                         f"{tuple(hidden_states.shape)}")
    recipe = get_recipe(getattr(self, "mxfp8_recipe", DEFAULT_RECIPE))
    block_size = getattr(self, "mxfp8_block_size", DEFAULT_BLOCK_SIZE)
    x = _autocast(hidden_states)
    kw = {}
    if activation == "gpt_oss_swiglu":
        kw = dict(swiglu_alpha=float(self.alpha), swiglu_limit=float(self.limit))
    par = getattr(self, "mxfp8_expert_parallel", None)
    if par is not None:  # this rank holds experts expert_range(E_total, P, rank): dispatch, local layer, combine
        from . import expert_parallel as _ep
        group, num_experts, wire = par
        return _ep.expert_parallel_moe(x, top_k_index, top_k_weights, w1, w2, num_experts, group,
                                       block_size=block_size, wire=wire, gate_and_up_proj_bias=b1,
                                       down_proj_bias=b2, activation=activation, recipe=recipe, **kw)
    tp, be, a = route(top_k_index, top_k_weights, E, block_size)
    return moe(x, a, w1, w2, tp, be, block_size, gate_and_up_proj_bias=b1, down_proj_bias=b2,
               activation=activation, recipe=recipe, **kw)


def shard_experts(model, group, wire="native"):
    """Expert parallelism for a transformers MoE model: split the experts of every experts module of `model` over
    the ranks of `group` (a torch.distributed ProcessGroup, gloo; every rank calls this on the same model, built
    alike). Rank r keeps experts mxfp8.torch.expert_parallel.expert_range(E, P, r) of each module: its fused
    parameters (gate_up_proj, down_proj and their biases) are replaced, in place, by parameters holding only those
    experts (the same values), and the "mxfp8" implementation then runs the module through
    mxfp8.torch.expert_parallel.expert_parallel_moe: each rank's tokens are dispatched to the experts' ranks and
    combined back, bitwise equal to one process on the gathered batch given the same routing (top_k_index,
    top_k_weights). The routers stay in torch, replicated: their logits come from torch's GEMM, whose bits can depend
    on how many rows a rank holds, so end-to-end equality with one process holds where those logits agree; their
    gradients (and every dense parameter's) are data-parallel: sum them with
    mxfp8.torch.expert_parallel.all_reduce_dense_gradients or DDP (expert_parameter_names lists what to leave out).
    wire: "native", "bf16" or "mxfp8", as for BlockwiseMoE(expert_parallel_wire=). Returns the names of the
    sharded modules. Collective; also selects the "mxfp8" experts implementation (set_experts_implementation)."""
    from . import expert_parallel as _ep
    P, rank = _ep._check_group(group)
    _ep._check_wire(wire)
    names = []
    for name, mod in model.named_modules():
        if not is_experts_module(mod) or getattr(mod, "mxfp8_expert_parallel", None) is not None:
            continue
        check_experts(mod)
        E = mod.gate_up_proj.shape[0]
        if P > E:
            raise ValueError(f"{name}: {P} ranks for {E} experts (expert parallelism needs world size <= experts)")
        e0, n = _ep.expert_range(E, P, rank)
        for pname in ("gate_up_proj", "down_proj") + (("gate_up_proj_bias", "down_proj_bias") if mod.has_bias
                                                       else ()):
            old = getattr(mod, pname)
            setattr(mod, pname, nn.Parameter(old.detach()[e0:e0 + n].clone(), requires_grad=old.requires_grad))
        mod.mxfp8_expert_parallel = (group, E, wire)
        names.append(name)
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(IMPLEMENTATION)
    return names


def register():
    """Register "mxfp8" in transformers' ExpertsInterface (done on import; idempotent)."""
    ExpertsInterface.register(IMPLEMENTATION, experts_forward)


def configure(model, recipe=None, block_size=None):
    """Set the recipe (a name of mxfp8.torch.RECIPES or an MXFP8Recipe) and/or the block size (positions per block,
    >= 1) used by the mxfp8 experts implementation on every experts module of `model` (a model or a single
    experts module). Returns the list of the configured modules' names. Does not select the implementation (see
    model.set_experts_implementation("mxfp8"))."""
    r = None if recipe is None else get_recipe(recipe)
    if block_size is not None and (isinstance(block_size, bool) or not isinstance(block_size, int)
                                   or block_size < 1):
        raise ValueError(f"block_size: expected an int >= 1, got {block_size!r}")
    names = []
    for name, mod in model.named_modules():
        if is_experts_module(mod):
            if r is not None:
                mod.mxfp8_recipe = r
            if block_size is not None:
                mod.mxfp8_block_size = block_size
            names.append(name)
    return names


register()
