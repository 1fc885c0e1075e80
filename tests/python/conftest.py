"""pytest set-up for the mxfp8 Python tests.

The tests import the installed package (`make python` puts it, with its own libmxfp8.so, into .venv). When it is
not installed, they fall back to the source tree (python/) with the library from $MXFP8_LIBRARY or build/.
The oracle (mx_oracle.py) sits beside the tests and is imported as a plain module.
"""

import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
try:
    import mxfp8  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(REPO, "python"))
    import mxfp8  # noqa: F401


def pytest_report_header(config):
    try:
        inf = mxfp8.info()
        return [f"mxfp8 {inf['version']} from {inf['library']}: isa={inf['isa']} ({inf['isa_reason']}), "
                f"threads={inf['num_threads']}"]
    except Exception as e:  # the tests themselves will report it
        return [f"mxfp8: library not usable: {e}"]


@pytest.fixture
def rng(request):
    """A numpy Generator seeded from the test's name: reproducible, different per test."""
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(request.node.nodeid)) % (2**32)
    return np.random.default_rng(seed)
