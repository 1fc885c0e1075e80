"""Expert parallelism over MPI: the blockwise MXFP8 MoE layer split over the ranks of an mpi4py communicator
(libmxfp8_mpi; the C API and its full contract are in its header, mxfp8_mpi.h).

    from mpi4py import MPI
    import mxfp8.mpi as ep

    first, count = ep.expert_range(num_experts, MPI.COMM_WORLD)       # this rank's experts [first, first + count)
    output, ctx = ep.moe_forward(hidden_states, gate_up_proj_weight, down_proj_weight, num_experts,
                                 topk_ids, topk_weights, block_size=512, comm=MPI.COMM_WORLD)
    grads = ep.moe_backward(ctx, output_hidden_states_grad, gate_up_proj_weight, down_proj_weight)
    # grads = (hidden_states_grad [T_r, H], topk_weights_grad [T_r, K] (or expert_affinities_masked_grad
    #          [T_r*E, 1] when routed by affinities), gate_up_proj_weight_grad [E_r, H, 2, I],
    #          down_proj_weight_grad [E_r, I, H] [, gate_and_up_proj_bias_grad, down_proj_bias_grad])

Each rank passes its own tokens (hidden_states [T_r, H], T_r may be 0; topk_ids / topk_weights [T_r, K], or
expert_affinities_masked [T_r*E, 1]) and the weights of its own experts (expert_range: contiguous ranges, as even as
possible). Both calls are collective: every rank calls them in the same order with the same num_experts,
block_size, config, wire and sizes. The results are bitwise equal to the single-process mxfp8.blockwise_mm_fwd_mxfp8
/ blockwise_mm_bwd_mxfp8 of the gathered problem (all ranks' tokens concatenated in rank order, routed by
mxfp8.route), for any number of ranks and threads. wire="mxfp8" sends the token rows as MXFP8 codes + E8M0 scales
(about half the bytes of BF16); the results then equal the single-process layer given the rows' MX round trip.
A bad argument on any rank raises the same MXFP8Error on every rank, naming the rank; no rank is left waiting.

Needs mpi4py built against the MPI that libmxfp8_mpi uses (scripts/setup.sh builds it against Debian's Open MPI);
importing this module without mpi4py or without libmxfp8_mpi.so raises ImportError saying which is missing.
``import mxfp8`` itself never needs either. $MXFP8_MPI_LIBRARY=/path/to/libmxfp8_mpi.so overrides the search.
"""

import ctypes
import os

import numpy as np

from . import _lib
from .moe import _MoeConfig, _arr, _config, _i32, _opt_view, _scales_view, _weight_view

try:
    from mpi4py import MPI
except ImportError as _e:  # the clear message the package promises
    raise ImportError(f"mxfp8.mpi needs mpi4py, built against the MPI of libmxfp8_mpi (scripts/setup.sh does "
                      f"this: pip install --no-binary mpi4py mpi4py with Open MPI's mpicc): {_e}") from _e

__all__ = ["expert_range", "moe_forward", "moe_backward", "MoEContext", "WIRES", "library_path"]

WIRES = {"native": 0, "mxfp8": 1}
ERR_COMMUNICATION = 64
_lib.STATUS_NAMES.setdefault(ERR_COMMUNICATION, "MXFP8_MPI_ERR_COMMUNICATION")


def _load():
    env = os.environ.get("MXFP8_MPI_LIBRARY")
    base = _lib.lib()  # libmxfp8 first: libmxfp8_mpi finds it by its soname
    del base
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [env] if env else [os.path.join(os.path.dirname(_lib.library_path()), "libmxfp8_mpi.so"),
                               os.path.join(here, "libmxfp8_mpi.so")]
    errors = []
    for p in dict.fromkeys(paths):
        if not os.path.isfile(p):
            errors.append(f"{p}: not found")
            continue
        try:
            return ctypes.CDLL(p), p
        except OSError as e:
            errors.append(f"{p}: {e}")
    raise ImportError("mxfp8.mpi needs libmxfp8_mpi.so, which is built only when CMake finds MPI (Debian: "
                      "apt-get install openmpi-bin libopenmpi-dev, then rebuild; or set MXFP8_MPI_LIBRARY): "
                      + "; ".join(errors))


_L, _PATH = _load()
_P, _I, _I64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
for _name, _res, _args in (("mxfp8_mpi_last_error_message", ctypes.c_char_p, []),
                           ("mxfp8_mpi_moe_expert_range", _I, [_I64, _I, _I, _P, _P]),
                           ("mxfp8_mpi_moe_forward", _I, [_P, _P, _P, _P]),
                           ("mxfp8_mpi_moe_backward", _I, [_P, _P, _P]),
                           ("mxfp8_mpi_moe_context_free", None, [_P]),
                           ("mxfp8_mpi_moe_context_bytes", _I64, [_P]),
                           ("mxfp8_mpi_comm_size_bytes", _I, []),
                           ("mxfp8_mpi_comm_from_fortran", _I, [_I, _P]),
                           ("mxfp8_mpi_struct_size", _I64, [_I])):
    _f = getattr(_L, _name)
    _f.restype, _f.argtypes = _res, _args

_COMM = {8: ctypes.c_void_p, 4: ctypes.c_int}.get(_L.mxfp8_mpi_comm_size_bytes())
if _COMM is None:
    raise ImportError(f"mxfp8.mpi: unsupported sizeof(MPI_Comm) = {_L.mxfp8_mpi_comm_size_bytes()}")
_T = _lib.Tensor


class _FwdArgs(ctypes.Structure):
    _c_name = "mxfp8_mpi_moe_fwd_args"
    _fields_ = [("comm", _COMM), ("num_experts", _I64), ("hidden_states", _T), ("topk_ids", _T),
                ("topk_weights", _T), ("expert_affinities_masked", _T), ("gate_up_proj_weight", _T),
                ("down_proj_weight", _T), ("gate_and_up_proj_bias", _T), ("down_proj_bias", _T),
                ("gate_up_weight_scales", _T), ("down_weight_scales", _T), ("block_size", _I64),
                ("config", ctypes.POINTER(_MoeConfig)), ("wire", _I), ("keep_checkpoints", _I)]


class _BwdArgs(ctypes.Structure):
    _c_name = "mxfp8_mpi_moe_bwd_args"
    _fields_ = [("context", _P), ("output_hidden_states_grad", _T), ("gate_up_proj_weight", _T),
                ("down_proj_weight", _T), ("gate_and_up_proj_bias", _T), ("down_proj_bias", _T),
                ("gate_up_weight_scales", _T), ("down_weight_scales", _T)]


_GRADS = ("hidden_states_grad", "topk_weights_grad", "expert_affinities_masked_grad", "gate_up_proj_weight_grad",
          "down_proj_weight_grad", "gate_and_up_proj_bias_grad", "down_proj_bias_grad")


class _BwdGrads(ctypes.Structure):
    _c_name = "mxfp8_mpi_moe_bwd_grads"
    _fields_ = [(n, _T) for n in _GRADS]


_STATS = ("setup_seconds", "dispatch_seconds", "compute_seconds", "combine_seconds", "dispatch_bytes_sent",
          "dispatch_bytes_received", "combine_bytes_sent", "combine_bytes_received", "rows_sent", "rows_received",
          "local_pairs", "local_blocks")


class _Stats(ctypes.Structure):
    _c_name = "mxfp8_mpi_moe_stats"
    _fields_ = [(n, ctypes.c_double) for n in _STATS[:4]] + [(n, _I64) for n in _STATS[4:]]

    def as_dict(self):
        return {n: getattr(self, n) for n in _STATS}


for _k, _cls in enumerate((_FwdArgs, _BwdArgs, _BwdGrads, _Stats)):
    if ctypes.sizeof(_cls) != _L.mxfp8_mpi_struct_size(_k):
        raise ImportError(f"mxfp8.mpi: {_cls.__name__} does not match {_PATH} (sizes {ctypes.sizeof(_cls)} vs "
                          f"{_L.mxfp8_mpi_struct_size(_k)}): the library and this module come from different builds")


def library_path():
    """Path of the loaded libmxfp8_mpi.so."""
    return _PATH


def _check(status):
    if status != _lib.OK:
        msg = _L.mxfp8_mpi_last_error_message()
        raise _lib.MXFP8Error(status, msg.decode("utf-8", "replace") if msg else "")


def _comm(comm):
    comm = MPI.COMM_WORLD if comm is None else comm
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"comm must be an mpi4py.MPI.Comm, not {type(comm).__name__}")
    c = _COMM()
    _check(_L.mxfp8_mpi_comm_from_fortran(comm.py2f(), ctypes.byref(c)))
    return comm, c


def expert_range(num_experts, comm=None):
    """(first_expert, num_local_experts) of this rank of `comm` (default MPI.COMM_WORLD): E experts over P ranks in
    contiguous ranges, the first E % P ranks holding one more. Not collective."""
    comm = MPI.COMM_WORLD if comm is None else comm
    first, count = ctypes.c_int64(), ctypes.c_int64()
    _check(_L.mxfp8_mpi_moe_expert_range(int(num_experts), comm.Get_size(), comm.Get_rank(), ctypes.byref(first),
                                         ctypes.byref(count)))
    return first.value, count.value


class MoEContext:
    """What moe_forward keeps for moe_backward on this rank (received rows, routing plan, checkpoints). Freed by
    close() or when garbage-collected; usable for any number of backward calls. `forward_stats` / `backward_stats`:
    this rank's seconds (setup, dispatch, compute, combine) and bytes to / from other ranks of the last calls."""

    def __init__(self, ptr, comm, meta, stats):
        self._ptr = ptr
        self.comm = comm
        self._meta = meta
        self.forward_stats = stats
        self.backward_stats = None

    @property
    def nbytes(self):
        """Bytes of memory the context holds."""
        return int(_L.mxfp8_mpi_moe_context_bytes(self._ptr)) if self._ptr else 0

    def close(self):
        if getattr(self, "_ptr", None):
            _L.mxfp8_mpi_moe_context_free(self._ptr)
            self._ptr = None

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _out_dtype(x, dtype, name):
    if dtype is None:
        return np.asarray(x).dtype
    return _lib.np_dtype(_lib.parse_out_dtype(dtype, name))


def moe_forward(hidden_states, gate_up_proj_weight, down_proj_weight, num_experts, topk_ids=None, topk_weights=None,
                *, expert_affinities_masked=None, block_size=4096, config=None, comm=None, wire="native",
                keep_checkpoints=True, gate_and_up_proj_bias=None, down_proj_bias=None, gate_up_weight_scales=None,
                down_weight_scales=None, output_dtype=None, context=True):
    """Expert-parallel forward (collective). Returns (output [T_r, H], MoEContext or None when context=False).

    hidden_states [T_r, H] float32/bfloat16/float16; topk_ids [T_r, K] (distinct per row, in [0, num_experts)) with
    topk_weights [T_r, K], or expert_affinities_masked [T_r*E, 1] (routed pairs = nonzero entries);
    gate_up_proj_weight [E_r, H, 2, I] / down_proj_weight [E_r, I, H] of this rank's experts (float, or codes with
    gate_up_weight_scales [E_r, ceil(H/32), 2, I] / down_weight_scales [E_r, ceil(I/32), H]); biases with
    config.bias. config: MXFP8MOEBwdConfig (single_expert_dense must be False). wire: "native" or "mxfp8".
    keep_checkpoints: keep the forward's F32 checkpoints for the backward (False: recompute; same bits).
    output_dtype: default hidden_states' dtype."""
    cfg, cc = _config(config)
    comm, ccomm = _comm(comm)
    X = _arr(hidden_states, "hidden_states")  # its rank and shape: the library's checks, agreed by every rank
    a = _FwdArgs()
    a.comm = ccomm.value
    a.num_experts = int(num_experts)
    a.hidden_states = _lib.view(X)
    by_aff = expert_affinities_masked is not None
    if by_aff:
        a.expert_affinities_masked = _lib.view(_arr(expert_affinities_masked, "expert_affinities_masked"))
    if topk_ids is not None or topk_weights is not None:
        if topk_ids is None or topk_weights is None:
            raise ValueError("topk_ids and topk_weights go together")
        a.topk_ids = _lib.view(_i32(topk_ids, "topk_ids"))
        a.topk_weights = _lib.view(_arr(topk_weights, "topk_weights"))
    a.gate_up_proj_weight = _weight_view(gate_up_proj_weight, "gate_up_proj_weight")
    a.down_proj_weight = _weight_view(down_proj_weight, "down_proj_weight")
    a.gate_and_up_proj_bias = _opt_view(gate_and_up_proj_bias, "gate_and_up_proj_bias")
    a.down_proj_bias = _opt_view(down_proj_bias, "down_proj_bias")
    a.gate_up_weight_scales = _scales_view(gate_up_weight_scales, "gate_up_weight_scales")
    a.down_weight_scales = _scales_view(down_weight_scales, "down_weight_scales")
    a.block_size = int(block_size)
    a.config = ctypes.pointer(cc)
    a.wire = _lib.parse(WIRES, wire, "wire")
    a.keep_checkpoints = _lib.parse_bool(keep_checkpoints, "keep_checkpoints")
    out = np.empty(X.shape, _out_dtype(X, output_dtype, "output_dtype"))
    vo = _lib.view(out)
    ptr = ctypes.c_void_p()
    st = _Stats()
    _check(_L.mxfp8_mpi_moe_forward(ctypes.byref(a), ctypes.byref(vo), ctypes.byref(ptr) if context else None,
                                    ctypes.byref(st)))
    if not context:
        return out, None
    K = -1 if by_aff else int(np.asarray(topk_ids).shape[1])
    meta = dict(T=X.shape[0], H=X.shape[1], E=int(num_experts), K=K, Er=np.asarray(gate_up_proj_weight).shape[0],
                I=np.asarray(gate_up_proj_weight).shape[3], bias=bool(cfg.bias))
    return out, MoEContext(ptr.value, comm, meta, st.as_dict())


def _grad_buffer(given, shape, dtype, name):
    if given is None:
        return np.zeros(shape, dtype)
    if not isinstance(given, np.ndarray) or given.shape != tuple(shape):
        raise ValueError(f"{name}: expected a numpy array of shape {tuple(shape)}")
    if not given.flags.writeable:
        raise ValueError(f"{name}: the buffer is read-only")
    return given


def moe_backward(context, output_hidden_states_grad, gate_up_proj_weight, down_proj_weight, *,
                 gate_and_up_proj_bias=None, down_proj_bias=None, gate_up_weight_scales=None, down_weight_scales=None,
                 grad_dtype=None, hidden_states_grad=None, gate_up_proj_weight_grad=None, down_proj_weight_grad=None,
                 gate_and_up_proj_bias_grad=None, down_proj_bias_grad=None):
    """Expert-parallel backward (collective), with the forward's config, wire and communicator (from `context`).
    Returns (hidden_states_grad [T_r, H], topk_weights_grad [T_r, K] -- or expert_affinities_masked_grad
    [T_r*E, 1] when the forward was routed by affinities --, gate_up_proj_weight_grad [E_r, H, 2, I],
    down_proj_weight_grad [E_r, I, H]) plus the bias gradients [E_r, 2, I], [E_r, H] with config.bias.

    The weights are the forward's (codes: the backward's axes, gate_up_weight_scales [E_r, H, ceil(2I/32)],
    down_weight_scales [E_r, I, ceil(H/32)], as for blockwise_mm_bwd_mxfp8). grad_dtype: default dY's dtype.
    Output buffers may be given (*_grad=...): config.accumulate_hidden_states_grad / skip_grad_initialization add
    into them (written in place and returned)."""
    if not isinstance(context, MoEContext) or not context._ptr:
        raise ValueError("context must be an open MoEContext from moe_forward")
    m = context._meta
    dY = _arr(output_hidden_states_grad, "output_hidden_states_grad")  # [T_r, H]: checked by the library
    gdt = _out_dtype(dY, grad_dtype, "grad_dtype")
    b = _BwdArgs()
    b.context = context._ptr
    b.output_hidden_states_grad = _lib.view(dY)
    b.gate_up_proj_weight = _weight_view(gate_up_proj_weight, "gate_up_proj_weight")
    b.down_proj_weight = _weight_view(down_proj_weight, "down_proj_weight")
    b.gate_and_up_proj_bias = _opt_view(gate_and_up_proj_bias, "gate_and_up_proj_bias")
    b.down_proj_bias = _opt_view(down_proj_bias, "down_proj_bias")
    b.gate_up_weight_scales = _scales_view(gate_up_weight_scales, "gate_up_weight_scales")
    b.down_weight_scales = _scales_view(down_weight_scales, "down_weight_scales")
    T, H, E, K, Er, I = m["T"], m["H"], m["E"], m["K"], m["Er"], m["I"]
    outs = [("hidden_states_grad", (T, H), hidden_states_grad),
            ("expert_affinities_masked_grad", (T * E, 1), None) if K < 0 else ("topk_weights_grad", (T, K), None),
            ("gate_up_proj_weight_grad", (Er, H, 2, I), gate_up_proj_weight_grad),
            ("down_proj_weight_grad", (Er, I, H), down_proj_weight_grad)]
    if m["bias"]:
        outs += [("gate_and_up_proj_bias_grad", (Er, 2, I), gate_and_up_proj_bias_grad),
                 ("down_proj_bias_grad", (Er, H), down_proj_bias_grad)]
    g = _BwdGrads()
    arrays = []
    for name, shape, given in outs:
        arr = _grad_buffer(given, shape, gdt, name)
        v = _lib.view(arr)
        if v.array is not arr:
            raise ValueError(f"{name}: the buffer must have element-aligned strides")
        setattr(g, name, v)
        arrays.append(arr)
    st = _Stats()
    _check(_L.mxfp8_mpi_moe_backward(ctypes.byref(b), ctypes.byref(g), ctypes.byref(st)))
    context.backward_stats = st.as_dict()
    return tuple(arrays)
