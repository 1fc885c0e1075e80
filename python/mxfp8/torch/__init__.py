"""mxfp8.torch -- PyTorch front end of libmxfp8: MXFP8 custom ops, nn modules and recipes (CPU tensors).

    import torch, mxfp8.torch as mt
    model = mt.convert_to_mxfp8(model, recipe="mxfp8")          # every nn.Linear -> MXFP8Linear, in place
    moe = mt.BlockwiseMoE(hidden_size=256, intermediate_size=512, num_experts=8, top_k=2)
    compiled = torch.compile(model, fullgraph=True)              # the ops have fake kernels and autograd formulas

Functions (all differentiable where it makes sense, all taking torch tensors straight into the library as zero-copy
views: data_ptr and strides, any strides the library accepts):
    quantize(x, elem_dtype, axis, scale_rule, group, out=)       -> (float8 data, float8_e8m0fnu scales)
    dequantize(data, scales, axis, group, output_dtype, out=)    -> tensor
    linear(input, weight, bias, recipe, out=)                    -> y = input @ weight^T + bias (MXFP8 GEMMs)
    linear_backward(grad_output, input, weight, recipe, grad_input=, grad_weight=)
    router_linear(input, weight, bias)                           -> float32 router logits, each row's bits
                                                                     independent of the batch and the threads
    topk_softmax(router_logits, top_k, renormalize)              -> (topk_weights, topk_ids): the router
    route(topk_ids, topk_weights, num_experts, block_size)       -> (token_position_to_id, block_to_expert,
                                                                     expert_affinities_masked)
    moe(hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight, token_position_to_id,
        block_to_expert, block_size, ...)                        -> output (the blockwise MoE layer)
    load_balancing_loss(router_logits, num_experts, top_k, attention_mask=None) -> the auxiliary MoE loss
                                                                     (transformers' formula)
    select_experts(router_logits, top_k, score_func=, renormalize=, score_correction_bias=, n_group=, topk_group=,
                   routed_scaling_factor=)                       -> (topk_weights, topk_ids): router variants
Modules: MXFP8Linear, convert_to_mxfp8, BlockwiseMoE (with expert_parallel_group=: its experts split over a
torch.distributed gloo group; mxfp8.torch.expert_parallel holds the functional layer, the dense-gradient all-reduce
and the checkpoint helpers). Hugging Face transformers: ``import mxfp8.torch.hf`` registers
the "mxfp8" experts implementation (model.set_experts_implementation("mxfp8")); convert_to_mxfp8 uses it.
Recipes: RECIPES ("nki", "mxfp8", "ocp"), MXFP8Recipe.
Memory: the ops' output buffers (activations, gradients, MoE checkpoints) are reused by later calls of the same
shape once nothing refers to them, so a training step of fixed shapes allocates no fresh memory after the first:
empty_cache() releases what is kept, memory_reserved() tells its size, set_buffer_reuse(False) turns reuse off
(mxfp8.torch._buffers says the rules).
Statistics: ``with collect_stats(model) as stats:`` records the quantization statistics of every layer during a
training step (mxfp8.torch.stats).
The registered ops live in torch.ops.mxfp8 (quantize, dequantize, linear, linear_backward, router_linear,
topk_softmax, route, moe, their backward ops, ids_to_int32 and out= variants).

Tensors must be on the CPU (a CUDA tensor raises ValueError naming the parameter); dtypes float32, bfloat16,
float16 for values, float8_e4m3fn / float8_e5m2 for codes, float8_e8m0fnu (or uint8) for scales, int32 / int64
for ids (int64 is converted once to the library's int32, with a range check). Errors of the library raise
mxfp8.MXFP8Error with the library's message; nothing is written on error. ``import mxfp8`` does not import torch;
``import mxfp8.torch`` does.
"""

try:
    import torch  # noqa: F401  (the PyTorch package, not this module: absolute import)
except ImportError as e:  # an optional dependency: say what is missing and how to get it, before any work
    raise ImportError(f"mxfp8.torch needs PyTorch >= 2.7 (pip install 'mxfp8[torch]', or pip install torch): "
                      f"{e}") from e
if not hasattr(torch, "float8_e8m0fnu") or not hasattr(getattr(torch, "library", None), "custom_op"):
    raise ImportError(f"mxfp8.torch needs PyTorch >= 2.7 (torch.float8_e8m0fnu, torch.library.custom_op), found "
                      f"torch {getattr(torch, '__version__', '?')}")

from .modules import BlockwiseMoE, MXFP8Linear, convert_to_mxfp8  # noqa: F401
from .moe_ops import moe, route, router_linear, topk_softmax  # noqa: F401
from .ops import dequantize, linear, linear_backward, quantize  # noqa: F401
from .recipes import RECIPES, MXFP8Recipe, get_recipe  # noqa: F401
from . import routing  # noqa: F401
from . import expert_parallel  # noqa: F401
from .routing import load_balancing_loss, select_experts  # noqa: F401
from .stats import collect_stats  # noqa: F401
from ._buffers import buffer_stats, empty_cache, memory_reserved, set_buffer_reuse  # noqa: F401

__all__ = ["quantize", "dequantize", "linear", "linear_backward", "router_linear", "topk_softmax", "route", "moe",
           "MXFP8Linear", "convert_to_mxfp8", "BlockwiseMoE", "RECIPES", "MXFP8Recipe", "get_recipe", "collect_stats",
           "load_balancing_loss", "select_experts", "empty_cache", "memory_reserved", "set_buffer_reuse",
           "buffer_stats"]
