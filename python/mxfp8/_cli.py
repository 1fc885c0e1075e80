"""``python -m mxfp8``: the mxfp8 command-line tool. The logic lives in the top-level package mxfp8_cli (the console
entry point), which starts without importing mxfp8; this module keeps the old import path."""

from mxfp8_cli import executable, main  # noqa: F401
