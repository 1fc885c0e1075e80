"""Mistakes a new user makes with mxfp8.torch, each answered by a clear error naming the parameter: clamp_limits
given as a tuple (before: silently no clamping at all), set_buffer_reuse("no") (before: taken as True), and
mxfp8.torch imported where PyTorch is missing or too old (the message says what to install)."""

import os
import subprocess
import sys

import pytest
import torch

import mxfp8
import mxfp8.torch as mt

T, H, I, E, K, BS = 32, 64, 32, 4, 2, 16


def test_moe_clamp_limits_must_be_a_clamp_limits():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(T, H, generator=g)
    w1 = torch.randn(E, H, 2, I, generator=g) * 0.1
    w2 = torch.randn(E, I, H, generator=g) * 0.1
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    tp, be, a = mt.route(ids, torch.rand(T, K, generator=g), E, BS)
    for bad in ((0.05, 0.1), [0.05, 0.1], "0.1"):
        with pytest.raises(TypeError, match="clamp_limits: expected an mxfp8.ClampLimits, a dict of its fields or "
                                            "None, got " + type(bad).__name__):
            mt.moe(x, a, w1, w2, tp, be, BS, clamp_limits=bad)
        with pytest.raises(TypeError, match="clamp_limits: expected an mxfp8.ClampLimits"):
            mt.BlockwiseMoE(H, I, E, K, block_size=BS, clamp_limits=bad)  # at construction, not at the first call
    # what the tuple was meant to be does clamp: the outputs differ from the unclamped layer's
    lim = mxfp8.ClampLimits(linear_clamp_lower_limit=0.05, linear_clamp_upper_limit=0.1)
    clamped = mt.moe(x, a, w1, w2, tp, be, BS, clamp_limits=lim)
    assert not torch.equal(clamped, mt.moe(x, a, w1, w2, tp, be, BS))
    assert torch.equal(clamped, mt.moe(x, a, w1, w2, tp, be, BS, clamp_limits=dict(
        linear_clamp_lower_limit=0.05, linear_clamp_upper_limit=0.1)))


def test_set_buffer_reuse_takes_only_a_boolean():
    prev = mt.set_buffer_reuse(True)
    try:
        for bad, exc in (("no", TypeError), ("0", TypeError), (None, TypeError), (2, ValueError)):
            with pytest.raises(exc, match="set_buffer_reuse: enabled: .* is not a boolean"):
                mt.set_buffer_reuse(bad)
            assert mt.set_buffer_reuse(True) is True  # unchanged by the refused call
        assert mt.set_buffer_reuse(0) is True and mt.set_buffer_reuse(1) is False
    finally:
        mt.set_buffer_reuse(prev)


@pytest.mark.parametrize("trick, message", [
    ("sys.modules['torch'] = None", "mxfp8.torch needs PyTorch >= 2.7 (pip install 'mxfp8[torch]', or pip install "
                                    "torch)"),
    ("import types; sys.modules['torch'] = types.ModuleType('torch'); sys.modules['torch'].__version__ = '2.1.0'",
     "mxfp8.torch needs PyTorch >= 2.7 (torch.float8_e8m0fnu, torch.library.custom_op), found torch 2.1.0"),
])
def test_import_without_a_usable_torch_says_what_to_install(trick, message):
    code = f"import sys; {trick}\nimport mxfp8.torch"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ))
    assert r.returncode == 1
    assert f"ImportError: {message}" in r.stderr, r.stderr


def _example(name):
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples",
                        name + ".py")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("example", ["train_moe_lm", "finetune_hf_moe"])
@pytest.mark.parametrize("args, message", [
    (["--top-k", "9", "--experts", "4"], "--top-k must be in [1, --experts = 4], got 9"),
    (["--block-size", "0"], "--block-size must be >= 1, got 0"),
    (["--experts", "0"], "--experts must be >= 1, got 0"),
    (["--heads", "0"], "--heads must be >= 1, got 0"),
    (["--width", "100", "--heads", "3"], "--width 100 must be a multiple of --heads 3"),
    (["--threads", "-1"], "--threads and --warmup must be >= 0"),
])
def test_examples_refuse_bad_sizes_as_usage_errors(example, args, message, capsys, monkeypatch):
    # before: the run started (corpus read, model built) and died with a ValueError traceback from BlockwiseMoE, or
    # a ZeroDivisionError for --heads 0
    mod = _example(example)
    monkeypatch.setattr(sys, "argv", [f"{example}.py"])  # argparse's program name
    with pytest.raises(SystemExit) as e:
        mod.parse_args(args)
    assert e.value.code == 2
    assert f"{example}.py: error: {message}" in capsys.readouterr().err
    assert mod.parse_args(["--steps", "3"]).steps == 3  # the defaults are valid


def test_collect_stats_of_something_that_is_not_a_module():
    with pytest.raises(TypeError, match="model: expected a torch.nn.Module \\(or None\\), got str"):
        with mt.collect_stats("model"):  # before: AttributeError "'str' object has no attribute 'named_modules'"
            pass
    with mt.collect_stats(torch.nn.Sequential(mt.MXFP8Linear(32, 16))) as s:
        mt.quantize(torch.randn(2, 32))
    assert s.records  # a module (and None) still work


def test_load_balancing_loss_checks_its_arguments():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(16, 4, generator=g)
    for args, message in (((4, 5), r"top_k: expected an int in \[1, 4\] \(the number of experts\), got 5"),
                          ((4, 0), r"top_k: expected an int in \[1, 4\]"),
                          ((0, 1), "num_experts: expected an int >= 1, got 0"),
                          ((4, 2.0), r"top_k: expected an int in \[1, 4\] .*got None"),
                          ((8, 2), r"router_logits\[0\]: expected a tensor \[rows, num_experts = 8\], got \(16, 4\)")):
        with pytest.raises(ValueError, match=message):  # before: RuntimeErrors from torch.topk / broadcasting
            mt.load_balancing_loss(logits, *args)
    with pytest.raises(ValueError, match=r"router_logits\[1\]: expected a tensor \[rows, num_experts = 4\]"):
        mt.load_balancing_loss((logits, logits[:, :3]), 4, 2)
    # the value: transformers' formula, written here from its definition
    p = torch.softmax(logits, -1)
    f = torch.nn.functional.one_hot(p.topk(2, -1).indices, 4).sum(1).float().mean(0)
    assert mt.load_balancing_loss(logits, 4, 2).item() == pytest.approx((4 * (f * p.mean(0)).sum()).item(), rel=1e-6)


@pytest.mark.parametrize("value, enabled, warns", [("0", False, False), ("false", False, False), ("Off", False, False),
                                                   ("no", False, False), ("1", True, False), ("true", True, False),
                                                   ("maybe", True, True)])
def test_reuse_buffers_environment_variable(value, enabled, warns):
    # before: only "0" (and "") turned reuse off; "false" / "off" / "no" silently kept it on
    code = "import mxfp8.torch; from mxfp8.torch import _buffers; print(_buffers._enabled)"
    r = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, MXFP8_TORCH_REUSE_BUFFERS=value))
    assert r.returncode == 0 and r.stdout.strip() == str(enabled), r.stdout + r.stderr
    assert ("MXFP8_TORCH_REUSE_BUFFERS='maybe' is not one of" in r.stderr) == warns, r.stderr


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(activation="gelu"), ValueError, "activation"),
    (dict(activation=3), TypeError, "activation"),
    (dict(affinity_option="x"), ValueError, "affinity_option"),
    (dict(hidden_size=0), ValueError, "hidden_size"),
    (dict(intermediate_size=-1), ValueError, "intermediate_size"),
    (dict(num_shared_experts=-1), ValueError, "num_shared_experts"),
    (dict(block_size=2.5), ValueError, "block_size"),
    (dict(routed_scaling_factor=float("nan")), ValueError, "routed_scaling_factor"),
    (dict(bias="no"), TypeError, "bias"),
    (dict(renormalize="no"), TypeError, "renormalize"),
    (dict(batch_invariant_router="yes"), TypeError, "batch_invariant_router"),
])
def test_blockwise_moe_constructor_checks_every_argument(kwargs, exc, match):
    """A bad BlockwiseMoE argument is refused when the module is built, naming the argument (not at the first
    forward, not as a torch error from deep inside)."""
    args = dict(hidden_size=64, intermediate_size=32, num_experts=4, top_k=2)
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        mt.BlockwiseMoE(**args)


def test_convert_to_mxfp8_checks_its_arguments():
    with pytest.raises(TypeError, match="model: expected a torch.nn.Module"):
        mt.convert_to_mxfp8("model")
    for bs in (0, -5, "64", 2.5):
        with pytest.raises(ValueError, match="block_size"):
            mt.convert_to_mxfp8(torch.nn.Sequential(torch.nn.Linear(32, 32)), block_size=bs)
    with pytest.raises(TypeError, match="filter_fn"):
        mt.convert_to_mxfp8(torch.nn.Sequential(torch.nn.Linear(32, 32)), filter_fn="layers.0")
