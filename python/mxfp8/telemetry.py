"""Quantization statistics of every library call in a region of code, grouped by layer -- for watching the numerics of
a training step (how many elements saturate or flush to zero, which scales occur, the SQNR of each operand).

    with mxfp8.collect_stats() as stats:
        with stats.layer("attn.proj"):
            y = mxfp8.matmul_mxfp8(x, w)
            ...
        gx, gw = mxfp8.matmul_mxfp8_backward(dy, w, x)       # recorded under the layer name in force, "" here
    print(stats.table())
    stats.records["attn.proj"]["matmul"]["weights"]["sqnr_db"]

While a collector is active on a thread, every quantizing call that thread makes through this package (quantize,
the matmul forward and backward, the MoE forward and backward -- also when reached from another front end of the
package, such as the PyTorch one) records the statistics of each quantization it performs, as if asked with
stats=True, and the results are unchanged. Records accumulate over calls with the same (layer, call, operand): counts,
histograms and sums add up, sqnr_db is recomputed from the sums. For PyTorch models, ``stats.attach(model)`` labels
every call with the qualified name of the module running it (through module hooks; see attach).
"""

import contextlib
import ctypes
import math

from . import _lib

__all__ = ["collect_stats", "StatsCollector"]

_MATMUL_OPERANDS = {"mxfp8_gemm": ("a", "b"), "mxfp8_matmul": ("input_activation", "weights"),
                    "mxfp8_linear": ("input_activation", "weights")}
_KIND = {"mxfp8_quantize": "quantize", "mxfp8_gemm": "gemm", "mxfp8_matmul": "matmul", "mxfp8_linear": "matmul",
         "mxfp8_matmul_backward": "matmul_backward", "mxfp8_moe_forward": "moe_forward",
         "mxfp8_moe_backward": "moe_backward"}
_SUMMED = ("elements", "groups", "saturated", "flushed_to_zero", "subnormal", "nonfinite_groups", "zero_groups",
           "sum_sq_error", "sum_sq_signal")


def _merge(old, new):
    """The statistics of two quantizations together."""
    if old is None:
        return dict(new)
    out = {k: old[k] + new[k] for k in _SUMMED}
    out["scale_histogram"] = [a + b for a, b in zip(old["scale_histogram"], new["scale_histogram"])]
    s, e = out["sum_sq_signal"], out["sum_sq_error"]
    out["sqnr_db"] = math.nan if not s > 0 else (math.inf if e == 0 else 10.0 * math.log10(s / e))
    return out


class StatsCollector:
    """Statistics of the quantizations made while it is active (see the module doc). ``records`` is
    {layer: {call: {operand: stats dict}}}, call one of "quantize", "gemm", "matmul", "matmul_backward",
    "moe_forward", "moe_backward"; operands are named as the functions' own stats results name them (for the MoE
    passes "expert{e}.{operand}", operand from MOE_OPERANDS; operands a call did not quantize are left out)."""

    def __init__(self):
        self.records = {}
        self._labels = [""]
        self._bwd = None  # attach(): the module whose backward began last
        self._prev = None

    # ---- labels ----
    @contextlib.contextmanager
    def layer(self, name):
        """Record the calls made inside the block under `name` (nestable; the innermost name counts)."""
        self._labels.append(str(name))
        try:
            yield self
        finally:
            self._labels.pop()

    def attach(self, module):
        """Label the calls of a PyTorch module tree by qualified name (as module.named_modules() gives it; "" for the
        root): a forward call gets the innermost submodule whose forward is running; a backward call (matmul or MoE
        backward) the submodule whose backward began last (a leaf layer's backward starts right before its own
        backward call runs; a forward starting forgets it). Returns the hook handles; they are removed when the
        collector's `with` block ends (or call .remove() on each)."""
        def fwd_pre(name):
            def hook(*_):  # returns None: a hook's result would replace the module's values
                self._labels.append(name)
                self._bwd = None
            return hook

        def fwd_post(*_):
            if len(self._labels) > 1:
                self._labels.pop()

        def bwd_pre(name):
            def hook(*_):
                self._bwd = name
            return hook

        handles = []
        for name, m in module.named_modules():
            handles.append(m.register_forward_pre_hook(fwd_pre(name)))
            handles.append(m.register_forward_hook(fwd_post))
            handles.append(m.register_full_backward_pre_hook(bwd_pre(name)))
        self._handles = getattr(self, "_handles", []) + handles
        return handles

    # ---- results ----
    def table(self):
        """A text table: one row per (layer, call, operand) with elements, saturated, flushed to zero, subnormal,
        non-finite and all-zero groups and the SQNR in dB."""
        rows = [("layer", "call", "operand", "elements", "saturated", "flushed", "subnormal", "nonfinite_g",
                 "zero_g", "sqnr_db")]
        for lab, calls in self.records.items():
            for kind, ops in calls.items():
                for op, s in ops.items():
                    rows.append((lab or "-", kind, op, str(s["elements"]), str(s["saturated"]),
                                 str(s["flushed_to_zero"]), str(s["subnormal"]), str(s["nonfinite_groups"]),
                                 str(s["zero_groups"]), f"{s['sqnr_db']:.2f}"))
        w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w[i]) if i < 3 else c.rjust(w[i]) for i, c in enumerate(r)) for r in rows)

    def _record(self, kind, operand, st):
        if st["elements"] == 0:
            return
        label = self._bwd if kind.endswith("_backward") and self._bwd is not None else self._labels[-1]
        ops = self.records.setdefault(label, {}).setdefault(kind, {})
        ops[operand] = _merge(ops.get(operand), st)

    # ---- the call observer (_lib.call) ----
    def _observe(self, name, args, run):
        kind = _KIND[name]
        slots = []  # (the struct whose `stats` field receives the statistics, the names of its entries)
        if name == "mxfp8_quantize":
            slots.append((args[2]._obj, ("x",)))
        elif name in _MATMUL_OPERANDS:
            slots += [(args[i]._obj, (_MATMUL_OPERANDS[name][i],)) for i in (0, 1)]
        elif name == "mxfp8_matmul_backward":
            from .matmul import BWD_QUANTIZATIONS
            slots.append((args[0]._obj, BWD_QUANTIZATIONS))
        else:
            from .moe import MOE_OPERANDS
            E = int(args[0]._obj.gate_up_proj_weight.shape[0])
            slots.append((args[0]._obj, tuple(f"expert{e}.{op}" for e in range(E) for op in MOE_OPERANDS)))
        bufs = []
        for struct, names in slots:
            if struct.stats:  # the caller asked for them itself: read them after the call
                bufs.append((struct, names, (_lib.QuantStats * len(names)).from_address(struct.stats), False))
            else:
                arr = (_lib.QuantStats * len(names))()
                struct.stats = ctypes.addressof(arr)
                bufs.append((struct, names, arr, True))
        try:
            run()
        finally:
            for struct, _, _, ours in bufs:
                if ours:
                    struct.stats = None
        for _, names, arr, _ in bufs:
            for i, op in enumerate(names):
                self._record(kind, op, _lib.stats_dict(arr[i]))

    # ---- activation ----
    def __enter__(self):
        self._prev = _lib.set_observer(self)
        return self

    def __exit__(self, *exc):
        _lib.set_observer(self._prev)
        self._bwd = None
        for h in getattr(self, "_handles", []):
            h.remove()
        self._handles = []
        return False


def collect_stats():
    """A StatsCollector to use as ``with mxfp8.collect_stats() as stats:``: inside the block, every quantizing call
    this thread makes records its statistics under the current layer (stats.layer(name), or module names with
    stats.attach(model)); stats.records and stats.table() give them. Results of the calls are unchanged."""
    return StatsCollector()


_lib.OBSERVED_CALLS.update(_KIND)
