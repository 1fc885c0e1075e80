"""Reusable memory of the mxfp8.torch ops: the output buffers of the ops are kept and handed out again in later
calls of the same shape, so that a training step of fixed shapes allocates no fresh tensor memory after the first
step (a fresh tensor of a few MB costs a page fault per 4 KiB page on its first write, every step).

What is reused: the outputs of the linear, linear_backward, moe and moe_backward ops (activations, gradients,
the MoE checkpoints saved for the backward) and their FP32 temporaries, when at least 64 KiB. A buffer is handed
out again only when nothing else refers to its memory any more (no tensor, view, saved tensor or .grad: the
reference count of its storage is 1), so reuse never changes a value anyone can see. The memory stays held after
its last user is gone: at most ``_PER_SIZE`` buffers per byte size, for the ``_SIZES`` byte sizes used most
recently; ``empty_cache()`` releases it (and the calling thread's library workspace), ``memory_reserved()`` tells
how much is held. ``set_buffer_reuse(False)`` (or MXFP8_TORCH_REUSE_BUFFERS=0 in the environment) turns reuse off:
every op then returns fresh tensors, with the same bits.
"""

import os
import threading
import warnings
from collections import OrderedDict

import torch

from .. import _lib

_MIN_BYTES = 64 * 1024  # smaller tensors come from malloc's own free lists, which already reuse them cheaply
_PER_SIZE = 4           # buffers kept per byte size (more in use at once are fresh, not kept)
_SIZES = 64             # byte sizes kept (least recently used dropped first)

# the number of references to a storage (the pool's own counts 1): torch's private counter; without it no reuse
_use_count = getattr(torch._C, "_storage_Use_Count", None)

_lock = threading.Lock()
_pool = OrderedDict()  # nbytes -> [torch.UntypedStorage]


def _env_reuse(value):
    """MXFP8_TORCH_REUSE_BUFFERS: 0 / false / no / off (or empty) turn reuse off, 1 / true / yes / on keep it on;
    another value keeps it on with a warning (it is not silently read as either)."""
    v = (value if value is not None else "1").strip().lower()
    if v in ("0", "false", "no", "off", ""):
        return False
    if v not in ("1", "true", "yes", "on"):
        warnings.warn(f"MXFP8_TORCH_REUSE_BUFFERS={value!r} is not one of 0/1, false/true, no/yes, off/on: buffer "
                      f"reuse stays on", RuntimeWarning, stacklevel=2)
    return True


_enabled = _use_count is not None and _env_reuse(os.environ.get("MXFP8_TORCH_REUSE_BUFFERS"))
_stats = {"reused": 0, "fresh": 0}
_poison = False  # tests: fill a buffer with 0xFF bytes (NaN in every float dtype) each time it is handed out again


def _wrap(storage, shape, dtype):
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)


def _kept_bytes():
    """Bytes of every kept buffer (the caller holds _lock)."""
    return sum(st.nbytes() for sts in _pool.values() for st in sts)


def empty(shape, dtype):
    """An uninitialized CPU tensor of `shape` and `dtype` (as torch.empty), from a kept buffer when one of its byte
    size is unused."""
    shape = tuple(int(s) for s in shape)
    n = 1
    for s in shape:
        n *= s
    nbytes = n * dtype.itemsize
    if not _enabled or nbytes < _MIN_BYTES:
        return torch.empty(shape, dtype=dtype)
    with _lock:
        kept = _pool.get(nbytes)
        if kept is not None:
            _pool.move_to_end(nbytes)
            for st in kept:
                if _use_count(st._cdata) == 1:
                    _stats["reused"] += 1
                    if _poison:
                        st.fill_(0xFF)
                    return _wrap(st, shape, dtype)
        _stats["fresh"] += 1
        st = torch.UntypedStorage(nbytes)
        if kept is None:
            kept = _pool[nbytes] = []
            while len(_pool) > _SIZES:
                _pool.popitem(last=False)
        if len(kept) < _PER_SIZE:
            kept.append(st)
        return _wrap(st, shape, dtype)


def empty_cache():
    """Release the memory mxfp8.torch keeps for reuse: the ops' kept buffers (a buffer still in use is freed by its
    last user) and the calling thread's library workspace (recreated on the next call). Other threads' workspaces
    are freed when those threads end."""
    with _lock:
        _pool.clear()
    _lib.release_workspace()


def memory_reserved():
    """Bytes mxfp8.torch holds for reuse: the ops' kept buffers (in use or not) plus the calling thread's library
    workspace."""
    with _lock:
        kept = _kept_bytes()
    return kept + _lib.workspace_bytes()


def set_buffer_reuse(enabled):
    """enabled: True turns the reuse of the ops' output buffers on (the default), False off (a bool, or the integer
    0 or 1: anything else, "no" for one, is an error); returns the previous setting. Off, every op returns fresh
    tensors (the same values: reuse never changes a result). Turning it off also releases the kept buffers."""
    enabled = bool(_lib.parse_bool(enabled, "set_buffer_reuse: enabled"))
    global _enabled
    prev = _enabled
    _enabled = bool(enabled) and _use_count is not None
    if not _enabled:
        with _lock:
            _pool.clear()
    return prev


def buffer_stats():
    """{"reused": n, "fresh": n, "kept_bytes": n}: how many op buffers were handed out again / freshly allocated
    since the process started, and the bytes kept now."""
    with _lock:
        return dict(_stats, kept_bytes=_kept_bytes())
