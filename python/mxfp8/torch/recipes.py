"""Recipes: named choices of the FP8 element dtype of each GEMM and of the E8M0 scale rule.

Every GEMM of a recipe quantizes both of its operands from high precision along its own contraction axis in 1x32
groups (OCP MX v1.0) -- the forward and both backward GEMMs of a linear layer, and the forward and the four backward
phases of the MoE experts. A recipe only says which element format and which scale rule they use:

    name     linear layers   MoE experts   scale rule   where it comes from
    "nki"    E5M2            E4M3          nki          the NKI kernels' defaults (matmul_mxfp8: float8_e5m2,
                                                        blockwise_mm_bwd_mxfp8: float8_e4m3fn; quantize_mx's rule)
    "mxfp8"  E4M3            E4M3          rceil        NVIDIA's MXFP8 pre-training recipe (E4M3 for weights,
                                                        activations and gradients, scale = ceil(log2(amax/448)),
                                                        as cuBLAS / TransformerEngine) and torchao's MX linear
    "ocp"    E4M3            E4M3          ocp          OCP MX v1.0 section 6.3: floor(log2 amax) - emax, saturating

Scale rules (mxfp8_scale_rule of the C library): "nki" e = floor(log2 amax) - (emax - 1), never saturates;
"ocp" e = floor(log2 amax) - emax, values past the largest normal saturate; "rceil" e = ceil(log2(amax / max_normal)).
A custom MXFP8Recipe(name, linear_dtype, moe_dtype, scale_rule) may be passed wherever a recipe name is taken.
"""

from dataclasses import dataclass

import torch

from .. import _lib

__all__ = ["MXFP8Recipe", "RECIPES", "get_recipe"]


@dataclass(frozen=True)
class MXFP8Recipe:
    """A recipe: name (shown in module reprs), linear_dtype and moe_dtype (torch.float8_e4m3fn or
    torch.float8_e5m2: the element dtype of the linear-layer GEMMs and of the MoE expert GEMMs), and scale_rule
    ("nki", "ocp" or "rceil") of every quantization. ValueError for any other value."""
    name: str
    linear_dtype: torch.dtype
    moe_dtype: torch.dtype
    scale_rule: str

    def __post_init__(self):
        for field in ("linear_dtype", "moe_dtype"):
            if getattr(self, field) not in (torch.float8_e4m3fn, torch.float8_e5m2):
                raise ValueError(f"MXFP8Recipe.{field}: {getattr(self, field)!r} is not torch.float8_e4m3fn or "
                                 f"torch.float8_e5m2")
        _lib.parse(_lib.SCALE_RULES, self.scale_rule, "MXFP8Recipe.scale_rule")


RECIPES = {
    "nki": MXFP8Recipe("nki", torch.float8_e5m2, torch.float8_e4m3fn, "nki"),
    "mxfp8": MXFP8Recipe("mxfp8", torch.float8_e4m3fn, torch.float8_e4m3fn, "rceil"),
    "ocp": MXFP8Recipe("ocp", torch.float8_e4m3fn, torch.float8_e4m3fn, "ocp"),
}


def get_recipe(recipe):
    """The MXFP8Recipe of `recipe`: a name in RECIPES ("nki", "mxfp8", "ocp"; any case) or an MXFP8Recipe, returned
    as is; ValueError for anything else."""
    if isinstance(recipe, MXFP8Recipe):
        return recipe
    if isinstance(recipe, str) and recipe.strip().lower() in RECIPES:
        return RECIPES[recipe.strip().lower()]
    raise ValueError(f"recipe: unknown recipe {recipe!r} (expected one of {', '.join(RECIPES)} or an MXFP8Recipe)")
