"""Helpers of the mxfp8.torch tests: torch <-> numpy conversion (bit-preserving), cosine similarity, and a recorder
of the views the torch layer hands to the C library (to check that no copy was made)."""

import ml_dtypes
import numpy as np
import torch

_NP_VIEW = {torch.bfloat16: (torch.int16, ml_dtypes.bfloat16), torch.float8_e4m3fn: (torch.uint8,
            ml_dtypes.float8_e4m3fn), torch.float8_e5m2: (torch.uint8, ml_dtypes.float8_e5m2),
            torch.float8_e8m0fnu: (torch.uint8, np.uint8)}


def to_np(t):
    """numpy array with the same bits (bfloat16 -> ml_dtypes.bfloat16, float8 -> ml_dtypes float8, e8m0 -> uint8)."""
    t = t.detach().contiguous()
    if t.dtype in _NP_VIEW:
        as_int, np_dt = _NP_VIEW[t.dtype]
        return t.view(as_int).numpy().view(np_dt)
    return t.numpy()


def from_np(a):
    """torch tensor with the same bits as numpy array a (ml_dtypes.bfloat16 -> torch.bfloat16)."""
    a = np.ascontiguousarray(a)
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def same_bits(a, b):
    """True when tensors a and b have equal dtype, shape and bits (NaNs compare equal by bits)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    ia = a.contiguous().view(torch.uint8) if a.element_size() == 1 else a.contiguous().view(
        {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()])
    ib = b.contiguous().view(ia.dtype)
    return torch.equal(ia, ib)


def cosine(a, b):
    a = a.detach().double().reshape(-1)
    b = b.detach().double().reshape(-1)
    na, nb = a.norm(), b.norm()
    if na == 0 and nb == 0:
        return 1.0
    return float(a @ b / (na * nb))


class ViewRecorder:
    """Records every C call of mxfp8.torch (name and the mxfp8_tensor views / argument structs it received)."""

    def __init__(self, monkeypatch):
        from mxfp8.torch import _bridge
        self.calls = []
        real = _bridge.invoke

        def spy(name, *args):
            self.calls.append((name, [getattr(a, "_obj", a) for a in args]))
            return real(name, *args)
        monkeypatch.setattr(_bridge, "invoke", spy)

    def last(self, name):
        found = [args for n, args in self.calls if n == name]
        assert found, f"{name} was not called (calls: {[n for n, _ in self.calls]})"
        return found[-1]


def assert_view_of(view, t):
    """The C view `view` addresses tensor t's own memory with t's shape and strides (no copy)."""
    assert view.data == t.data_ptr(), "the library received a copy, not the tensor's memory"
    n = t.dim()
    assert list(view.shape[:n]) == list(t.shape)
    assert list(view.strides[:n]) == list(t.stride())


def fake_cuda(*shape, dtype=torch.float32):
    """A tensor that reports device cuda (a FakeTensor: no GPU needed) to test the device check."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        return torch.empty(*shape, dtype=dtype, device="cuda")


__all__ = ["to_np", "from_np", "same_bits", "cosine", "ViewRecorder", "assert_view_of", "fake_cuda"]
