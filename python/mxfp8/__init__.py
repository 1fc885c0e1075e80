"""mxfp8 -- MXFP8 training kernels for CPUs (Python bindings of libmxfp8).

MX quantization (OCP Microscaling Formats v1.0; NKI quantize_mx):
    data, scales = mxfp8.quantize(x, fmt="e4m3", axis=-1, scale_rule="nki", group="1x32", rounding="nearest",
                                  seed=0, stats=False)   # stats=True: (data, scales, statistics dict)
    y = mxfp8.dequantize(data, scales, axis=-1, group="1x32", out_dtype="float32")
    scale layouts and element packing: scale_layout_shape, to_scale_layout, from_scale_layout, pack_x4, unpack_x4,
    swizzle_nki, unswizzle_nki.
Linear layer (NKI matmul_mxfp8): matmul_mxfp8_backward, matmul_mxfp8, MatmulMxfp8KernelConfig, goldens
    (matmul_golden_unquantized, matmul_golden_quantized, matmul_mxfp8_backward_golden) and compare_nki.
Blockwise Mixture of Experts (NKI moe_mxfp8): route, num_blocks, blockwise_mm_fwd_mxfp8, blockwise_mm_bwd_mxfp8,
    MXFP8MOEBwdConfig, ClampLimits, SkipMode, goldens (blockwise_mm_fwd_golden, blockwise_mm_bwd_golden); router and
    checkpoint helpers: topk_weights_grad, from_mixtral, to_mixtral.
Tensor files: load(path), save(path, tensors) for .safetensors and .npy (every numpy / ml_dtypes dtype the mxfp8
    command writes, FP8 and E8M0 included).
Numerics: stochastic rounding (rounding="stochastic", seed) and statistics (stats=True) in quantize, the matmul and
    MoE functions; collect_stats() records the statistics of every call in a block, per layer (mxfp8.telemetry);
    diff(x, data, scales) finds the quantization profile that explains another stack's MXFP8 bits.
Runtime: info(), set_num_threads(n), __version__.

Inputs: high-precision arrays are float32, ml_dtypes.bfloat16 or float16; float64 arrays (numpy's default), Python
numbers and lists are accepted wherever float32 is and rounded once to float32 (to nearest even). Errors from the
library raise MXFP8Error (with .status and .message); bad option values raise ValueError, bad dtypes TypeError.
help(mxfp8.<function>) gives each function's shapes, dtypes and errors.

The shared library is the copy installed inside this package; MXFP8_LIBRARY=/path/to/libmxfp8.so overrides it.

Expert parallelism over MPI lives in the submodule mxfp8.mpi (import it explicitly; it needs mpi4py and the
libmxfp8_mpi.so built when CMake finds MPI): ``import mxfp8`` never needs either.
"""

__version__ = "0.1.0"

from ._lib import MXFP8Error  # noqa: F401
from .diff import diff, quantize_profile  # noqa: F401
from .matmul import *  # noqa: F401,F403
from .moe import *  # noqa: F401,F403
from .moe_utils import from_mixtral, to_mixtral, topk_weights_grad  # noqa: F401
from .quant import (  # noqa: F401
    dequantize,
    from_scale_layout,
    info,
    pack_x4,
    quantization_metadata,
    quantize,
    scale_layout_shape,
    set_num_threads,
    swizzle_nki,
    to_scale_layout,
    unpack_x4,
    unswizzle_nki,
)
from .telemetry import StatsCollector, collect_stats  # noqa: F401
from .tensorfile import load, save  # noqa: F401
