"""What help(mxfp8.<name>) shows a user: every public function and class has a docstring that names each of its
parameters, and no docstring of the package carries internal shorthand (tracker numbers, "seed page", citation
tags of the C header, paths of the source tree).
"""

import importlib
import inspect
import os
import pkgutil
import re

import pytest

import mxfp8

PUBLIC = sorted(n for n in dir(mxfp8) if not n.startswith("_") and (inspect.isfunction(getattr(mxfp8, n)) or
                                                                       inspect.isclass(getattr(mxfp8, n))))
# "seed" alone is a random generator's seed (quantize(..., seed=0)); "seed page" / "seed 000" are shorthand
JARGON = re.compile(r"\bissue\s*\d|\bseed\s*(?:page|doc|\d)|\[NKI-[A-Z]\]|include/|\.md\b|\bupstream\b|\(ours\)|"
                    r"\bours:", re.I)


def _modules():
    for info in pkgutil.iter_modules(mxfp8.__path__):
        if not (info.ispkg or os.path.isfile(os.path.join(info.module_finder.path, info.name + ".py"))):
            continue  # the package's own libmxfp8.so, not a Python module
        if info.name == "__main__":
            continue  # `python -m mxfp8`: runs the command-line tool
        try:
            yield importlib.import_module(f"mxfp8.{info.name}")
        except ImportError as e:
            if getattr(e, "name", "") != "torch":
                raise


def test_public_names_are_there():
    for name in ("quantize", "dequantize", "matmul_mxfp8_backward", "matmul_mxfp8", "route", "blockwise_mm_fwd_mxfp8",
                 "blockwise_mm_bwd_mxfp8", "load", "save", "topk_weights_grad", "from_mixtral", "to_mixtral",
                 "MXFP8MOEBwdConfig", "MatmulMxfp8KernelConfig", "ClampLimits", "SkipMode", "MXFP8Error"):
        assert name in PUBLIC, name


@pytest.mark.parametrize("name", PUBLIC)
def test_docstring_names_every_parameter(name):
    obj = getattr(mxfp8, name)
    doc = inspect.getdoc(obj) or ""
    assert len(doc) > 80, f"mxfp8.{name} has no real docstring"
    if inspect.isclass(obj):
        params = [f.name for f in getattr(obj, "__dataclass_fields__", {}).values()]
    else:
        params = list(inspect.signature(obj).parameters)
    missing = [p for p in params if not re.search(rf"\b{re.escape(p)}\b", doc)]
    if inspect.isclass(obj) and name == "MXFP8MOEBwdConfig":  # the *_swizzle_mode fields are documented as a group
        missing = [p for p in missing if not p.endswith("_swizzle_mode")]
    assert not missing, f"mxfp8.{name}: the docstring does not mention {missing}"


def test_no_internal_jargon_in_any_docstring():
    bad = []
    for mod in _modules():
        texts = [("module", mod.__doc__ or "")]
        for n, obj in vars(mod).items():
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and getattr(obj, "__module__", "") == mod.__name__:
                texts.append((n, obj.__doc__ or ""))
                for m, meth in vars(obj).items() if inspect.isclass(obj) else ():
                    if inspect.isfunction(meth):
                        texts.append((f"{n}.{m}", meth.__doc__ or ""))
        for where, text in texts:
            for m in JARGON.finditer(text):
                bad.append(f"{mod.__name__}:{where}: {text[max(0, m.start() - 30):m.end() + 30]!r}")
    assert not bad, "\n".join(bad)


def test_messages_carry_no_jargon():
    """Error messages a user sees from the Python layer (a sample of each kind)."""
    import numpy as np
    msgs = []
    for call in (lambda: mxfp8.quantize(np.ones(4, complex)), lambda: mxfp8.quantize([1.0], fmt="e3m4"),
                 lambda: mxfp8.matmul_mxfp8_backward(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)),
                                                     float8_dtype="float8_e4m3")):
        with pytest.raises((TypeError, ValueError)) as e:
            call()
        msgs.append(str(e.value))
    for m in msgs:
        assert not JARGON.search(m), m
