"""mxfp8.collect_stats: every quantizing call in the block is recorded, per layer, with the statistics the call's own
stats=True returns; results are unchanged; records accumulate; other threads are not observed; module hooks label
the calls of a module tree (checked with an object offering the nn.Module hook methods)."""

import threading

import numpy as np
import pytest

import mxfp8


def test_records_equal_the_calls_own_statistics(rng):
    x = rng.standard_normal((64, 96)).astype(np.float32)
    w = rng.standard_normal((32, 96)).astype(np.float32)
    dy = rng.standard_normal((64, 32)).astype(np.float32)
    d_ref, s_ref, q_ref = mxfp8.quantize(x, stats=True)
    y_ref, mm_ref = mxfp8.matmul_mxfp8(x, w, output_dtype="float32", stats=True)
    b_ref = mxfp8.matmul_mxfp8_backward(dy, w, x, output_dtype="float32", stats=True)
    with mxfp8.collect_stats() as st:
        with st.layer("fc1"):
            d, s = mxfp8.quantize(x)
            y = mxfp8.matmul_mxfp8(x, w, output_dtype="float32")
        gx, gw = mxfp8.matmul_mxfp8_backward(dy, w, x, output_dtype="float32")
        with st.layer("fc1"):
            _, _, own = mxfp8.quantize(x, stats=True)  # asking itself: both see them
    assert np.array_equal(d.view(np.uint8), d_ref.view(np.uint8)) and np.array_equal(y, y_ref)
    assert np.array_equal(gx, b_ref[0]) and np.array_equal(gw, b_ref[1])
    assert own == q_ref
    rec = st.records
    assert set(rec) == {"fc1", ""}
    q = rec["fc1"]["quantize"]["x"]
    assert q["elements"] == 2 * q_ref["elements"] and q["sqnr_db"] == pytest.approx(q_ref["sqnr_db"])
    assert q["scale_histogram"] == [2 * v for v in q_ref["scale_histogram"]]
    assert rec["fc1"]["matmul"] == mm_ref
    assert rec[""]["matmul_backward"] == b_ref[2]
    table = st.table()
    assert "fc1" in table and "matmul_backward" in table and "weights_along_n" in table


def test_moe_per_expert_and_off_outside_the_block(rng):
    T, H, I, E, K, B = 48, 32, 32, 3, 2, 16
    X = rng.uniform(0, 1, (T, H)).astype(np.float32)
    W1 = rng.uniform(-0.1, 0.1, (E, H, 2, I)).astype(np.float32)
    W2 = rng.uniform(-0.1, 0.1, (E, I, H)).astype(np.float32)
    ids = np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int32)
    tp, be, a = mxfp8.route(ids, rng.uniform(0, 1, (T, K)).astype(np.float32), E, B)
    y0, _, ref = mxfp8.blockwise_mm_fwd_mxfp8(X, a, W1, W2, tp, be, B, stats=True)
    with mxfp8.collect_stats() as st:
        y, _ = mxfp8.blockwise_mm_fwd_mxfp8(X, a, W1, W2, tp, be, B)
    assert np.array_equal(y, y0)
    rec = st.records[""]["moe_forward"]
    for e in range(E):
        for op, v in ref[e].items():
            if v["elements"]:
                assert rec[f"expert{e}.{op}"] == v
            else:
                assert f"expert{e}.{op}" not in rec
    mxfp8.quantize(X)  # after the block: nothing recorded
    assert "quantize" not in st.records[""]


def test_other_threads_are_not_observed(rng):
    x = rng.standard_normal((32, 64)).astype(np.float32)
    with mxfp8.collect_stats() as st:
        t = threading.Thread(target=lambda: mxfp8.quantize(x))
        t.start()
        t.join()
    assert st.records == {}


class _Handle:
    def __init__(self, hooks, h):
        self.hooks, self.h = hooks, h

    def remove(self):
        self.hooks.remove(self.h)


class _Mod:
    """The hook methods of torch.nn.Module, enough to drive StatsCollector.attach."""

    def __init__(self, children=(), fn=None, bwd=None):
        self.children, self.fn, self.bwd = dict(children), fn, bwd
        self.hooks = {k: [] for k in ("fpre", "fpost", "bpre", "bpost")}

    def named_modules(self, prefix=""):
        yield prefix, self
        for n, c in self.children.items():
            yield from c.named_modules(f"{prefix}.{n}" if prefix else n)

    def _reg(self, kind, h):
        self.hooks[kind].append(h)
        return _Handle(self.hooks[kind], h)

    def register_forward_pre_hook(self, h):
        return self._reg("fpre", h)

    def register_forward_hook(self, h):
        return self._reg("fpost", h)

    def register_full_backward_pre_hook(self, h):
        return self._reg("bpre", h)

    def register_full_backward_hook(self, h):
        return self._reg("bpost", h)

    def forward(self):
        for h in self.hooks["fpre"]:
            h(self, ())
        if self.fn:
            self.fn()
        for c in self.children.values():
            c.forward()
        for h in self.hooks["fpost"]:
            h(self, (), None)

    def backward(self):
        for h in self.hooks["bpre"]:
            h(self, ())
        if self.bwd:
            self.bwd()
        for c in reversed(list(self.children.values())):
            c.backward()
        for h in self.hooks["bpost"]:
            h(self, (), ())


def test_attach_labels_calls_by_module(rng):
    """Forward calls: the innermost module whose forward runs; backward calls: the module whose backward began
    last (here the backward of "head" runs first, then that of "block.proj")."""
    x = rng.standard_normal((32, 64)).astype(np.float32)
    w = rng.standard_normal((16, 64)).astype(np.float32)
    dy = rng.standard_normal((32, 16)).astype(np.float32)
    proj = _Mod(fn=lambda: mxfp8.quantize(x), bwd=lambda: mxfp8.matmul_mxfp8_backward(dy, w, x))
    model = _Mod({"block": _Mod({"proj": proj}), "head": _Mod(fn=lambda: None)})
    with mxfp8.collect_stats() as st:
        st.attach(model)
        model.forward()
        model.backward()
        mxfp8.quantize(x)  # outside every module
    assert list(st.records) == ["block.proj", ""]
    assert st.records["block.proj"]["quantize"]["x"]["elements"] == x.size
    assert st.records["block.proj"]["matmul_backward"]["weights_along_n"]["elements"] == w.size
    assert st.records[""]["quantize"]["x"]["elements"] == x.size
    assert all(not v for v in model.hooks.values()), "the hooks are removed at the end of the block"
