"""mxfp8.torch's buffer reuse: a training loop of fixed shapes allocates nothing in the library after its first step
(a counting allocator preloaded into a child process counts libmxfp8's own malloc calls) and no fresh op buffer,
and gives the same bits as fresh allocations -- with every reused buffer poisoned with NaN before it is handed out,
so an op that read an output before writing it would show; a buffer still referenced is never handed out again;
empty_cache releases what is kept."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import mxfp8
import mxfp8.torch as mt
from mxfp8.torch import _buffers
from build_paths import BUILD_DIR, require


class _Net(nn.Module):
    """Dense layers with and without bias (FP32 master weights under BF16 autocast) and a MoE with biases whose
    router logits come from the library (batch_invariant_router)."""

    def __init__(self, D=64):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(D, 2 * D), nn.Linear(2 * D, D, bias=False)
        self.moe = mt.BlockwiseMoE(D, 96, 4, 2, block_size=16, bias=True, batch_invariant_router=True)
        self.head = nn.Linear(D, 32)

    def forward(self, x):
        x = x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))
        x = x + self.moe(x)
        return self.head(x)


def _train(steps, reuse, poison=False, seed=0):
    """(losses, final parameters, last step's gradients) of `steps` AdamW steps on fixed batches."""
    prev = mt.set_buffer_reuse(reuse)
    old_poison, _buffers._poison = _buffers._poison, poison
    try:
        torch.manual_seed(seed)
        net = mt.convert_to_mxfp8(_Net())
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(seed + 1)
        x, y = torch.randn(256, 64, generator=g), torch.randint(0, 32, (256,), generator=g)
        losses = []
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = net(x)
            loss = nn.functional.cross_entropy(out.float(), y)
            loss.backward()
            losses.append(loss.detach().clone())
            grads = {k: p.grad.clone() for k, p in net.named_parameters()}
            opt.step()
        return losses, {k: p.detach().clone() for k, p in net.named_parameters()}, grads
    finally:
        mt.set_buffer_reuse(prev)
        _buffers._poison = old_poison


def _same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def test_reuse_gives_the_bits_of_fresh_buffers():
    before = mt.buffer_stats()["reused"]
    l1, p1, g1 = _train(4, reuse=True, poison=True)
    assert mt.buffer_stats()["reused"] > before, "no buffer was reused: the test would prove nothing"
    l0, p0, g0 = _train(4, reuse=False)
    assert all(_same(a, b) for a, b in zip(l1, l0)), (l1, l0)
    for k in p0:
        assert _same(p1[k], p0[k]), k
        assert _same(g1[k], g0[k]), k


def test_no_fresh_op_buffer_after_the_first_step():
    mt.empty_cache()
    torch.manual_seed(0)
    net = mt.convert_to_mxfp8(_Net())
    x = torch.randn(256, 64)
    fresh = []
    for _ in range(4):
        net.zero_grad(set_to_none=True)
        f0 = mt.buffer_stats()["fresh"]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            net(x).float().square().mean().backward()
        fresh.append(mt.buffer_stats()["fresh"] - f0)
    assert fresh[0] > 0 and fresh[2:] == [0, 0], fresh


def test_a_referenced_buffer_is_never_handed_out_again():
    mt.empty_cache()
    lin = mt.MXFP8Linear(128, 256)
    x = torch.randn(512, 128)
    kept = lin(x).detach()          # 512 x 256 FP32: above the reuse threshold
    want = kept.clone()
    view = lin(x)[3:]               # a view keeps its base's buffer alive too
    view_want = view.detach().clone()
    for _ in range(3):
        y = lin(x * 2)
        assert y.untyped_storage().data_ptr() not in (kept.untyped_storage().data_ptr(),
                                                      view.untyped_storage().data_ptr())
        del y
    assert _same(kept, want) and _same(view.detach(), view_want)
    del kept, view
    y1 = lin(x)
    p1 = y1.untyped_storage().data_ptr()
    del y1
    assert lin(x).untyped_storage().data_ptr() == p1  # released: handed out again


def test_empty_cache_and_memory_reserved():
    mt.empty_cache()
    assert mt.memory_reserved() == 0
    lin = mt.MXFP8Linear(128, 256)
    lin(torch.randn(512, 128)).sum().backward()
    held = mt.memory_reserved()
    assert held >= 512 * 256 * 4 and mt.buffer_stats()["kept_bytes"] > 0
    mt.empty_cache()
    assert mt.memory_reserved() == 0 and mt.buffer_stats()["kept_bytes"] == 0
    assert mt.set_buffer_reuse(False) is True and mt.set_buffer_reuse(True) is False


_CHILD = textwrap.dedent("""
    import ctypes, sys, torch
    sys.path[:0] = {paths!r}
    sys.path.insert(0, {tests!r})
    import mxfp8.torch as mt
    from test_torch_buffers import _Net
    count = ctypes.CDLL(None).mxfp8_alloc_count
    count.restype = ctypes.c_longlong
    torch.set_num_threads(2)
    torch.manual_seed(0)
    net = mt.convert_to_mxfp8(_Net())
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x, y = torch.randn(256, 64), torch.randint(0, 32, (256,))
    calls = []
    for _ in range(4):
        c0 = count()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(net(x).float(), y)
        loss.backward()
        opt.step()
        calls.append(count() - c0)
    print("CALLS", *calls)
""")


def test_library_allocates_nothing_after_the_first_step(tmp_path):
    shim = os.path.join(BUILD_DIR, "libmxfp8_alloc_count.so")
    if not os.path.isfile(shim):
        pytest.fail(f"the counting allocator is missing: {shim} (run `make build`)", pytrace=False)
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(mxfp8.__file__)))
    here = os.path.dirname(os.path.abspath(__file__))
    script = tmp_path / "child.py"
    script.write_text(_CHILD.format(paths=[pkg_parent], tests=here))
    env = dict(os.environ, LD_PRELOAD=shim)
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    calls = [int(v) for v in r.stdout.split("CALLS")[1].split()]
    # the first step creates the thread's workspace and grows its slots: the allocator sees the library's calls
    assert calls[0] > 0, calls
    assert calls[1:] == [0, 0, 0], calls
