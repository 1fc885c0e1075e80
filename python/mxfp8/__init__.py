"""mxfp8 -- MXFP8 training kernels for CPUs (Python bindings of libmxfp8).

Quantization (OCP MX v1.0 / NKI quantize_mx):
    data, scales = mxfp8.quantize(x, fmt="e4m3", axis=-1, scale_rule="nki", group="1x32")
    y = mxfp8.dequantize(data, scales, axis=-1, group="1x32", out_dtype="float32")
Scale layouts and element packing: to_scale_layout, from_scale_layout, scale_layout_shape, pack_x4, unpack_x4,
swizzle_nki, unswizzle_nki. Runtime: info(), set_num_threads(n), __version__.
Errors from the library raise MXFP8Error (with .status and .message); bad option strings raise ValueError.

The shared library is the copy installed inside this package; MXFP8_LIBRARY=/path/to/libmxfp8.so overrides it.

Expert parallelism over MPI lives in the submodule mxfp8.mpi (import it explicitly; it needs mpi4py and the
libmxfp8_mpi.so built when CMake finds MPI): ``import mxfp8`` never needs either.
"""

__version__ = "0.1.0"

from ._lib import MXFP8Error  # noqa: F401
from .quant import (  # noqa: F401
    dequantize,
    from_scale_layout,
    info,
    pack_x4,
    quantize,
    scale_layout_shape,
    set_num_threads,
    swizzle_nki,
    to_scale_layout,
    unpack_x4,
    unswizzle_nki,
)

# matmul.py and moe.py are written on top of _lib by their owners; import them when present.
try:
    from .matmul import *  # noqa: F401,F403
except ImportError as _e:  # pragma: no cover - only while the module does not exist yet
    if getattr(_e, "name", None) != __name__ + ".matmul":
        raise
try:
    from .moe import *  # noqa: F401,F403
except ImportError as _e:  # pragma: no cover
    if getattr(_e, "name", None) != __name__ + ".moe":
        raise
