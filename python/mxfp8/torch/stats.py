"""Quantization statistics of a training step, per layer: ``mxfp8.torch.collect_stats(model)``.

    with mxfp8.torch.collect_stats(model) as stats:
        loss = loss_fn(model(x), y)
        loss.backward()
    print(stats.table())
    stats.records["layers.0.mlp"]["moe_backward"]["expert3.p1_dy"]["saturated"]

Inside the block every quantization the library makes for this thread (the forward and backward of MXFP8Linear and
BlockwiseMoE, mxfp8.torch.linear / moe / quantize, and the numpy front end) records its statistics (see
mxfp8.telemetry and the C header's "Quantization statistics"), labelled with the qualified name of the innermost
module of `model` whose forward or backward is running ("" for the root, or the label of stats.layer(name) blocks).
The model's outputs and gradients are bitwise the same as without the block; collecting costs a separate pass over
each operand (about 1 ns an element on one core). The hooks are removed when the block ends.
"""

import contextlib

import torch

from .. import telemetry as _telemetry

__all__ = ["collect_stats"]


@contextlib.contextmanager
def collect_stats(model=None):
    """A context manager yielding an mxfp8.StatsCollector: records = {layer: {call: {operand: stats dict}}} with call
    "quantize", "matmul", "matmul_backward", "moe_forward" or "moe_backward" and the dict of mxfp8.quantize(...,
    stats=True); .table() prints them. model: a torch.nn.Module whose submodules label the calls (or None)."""
    if model is not None and not isinstance(model, torch.nn.Module):  # checked before any call is recorded
        raise TypeError(f"model: expected a torch.nn.Module (or None), got {type(model).__name__}")
    with _telemetry.collect_stats() as st:
        if model is not None:
            st.attach(model)
        yield st
