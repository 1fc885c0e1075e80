"""Where the tests find what `make build` built.

BUILD_DIR: $MXFP8_BUILD_DIR (the Makefile passes the BUILD directory it built, so `make test BUILD=x` tests x), else
<repo>/build. CLI: $MXFP8_CLI, else BUILD_DIR/mxfp8. A missing binary is a test failure, never a skip:
require(path) fails the calling test with a message saying how to build it.
"""

import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BUILD_DIR = os.path.abspath(os.environ.get("MXFP8_BUILD_DIR") or os.path.join(REPO, "build"))
CLI = os.path.abspath(os.environ.get("MXFP8_CLI") or os.path.join(BUILD_DIR, "mxfp8"))


def require(path, what="the mxfp8 CLI"):
    """Fail (not skip) the calling test when `path` is not an executable file."""
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.fail(f"{what} is missing: {path} (run `make build`, or set MXFP8_BUILD_DIR to the build directory)",
                    pytrace=False)
    return path
