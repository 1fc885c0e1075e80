"""The ``mxfp8`` command (the console entry point; ``python -m mxfp8`` runs the same through mxfp8._cli): runs the
command-line tool shipped in the mxfp8 package (``mxfp8/bin/mxfp8``, built with the library by ``pip install .``)
with the same arguments, exit status and output. ``mxfp8 --help`` lists its commands.

A package of its own, beside mxfp8, so that starting the command imports nothing but this file: importing mxfp8
itself loads numpy, ml_dtypes and the library (about half a second), which the tool does not need. The mxfp8
package is found with importlib.util.find_spec, which locates it without running it.

MXFP8_PYTHON is set to this interpreter unless already set, so that ``--plot`` draws with the Python (and the
matplotlib) of the environment the command was started from.
"""

import os
import sys
from importlib.util import find_spec


def _package_dir():
    spec = find_spec("mxfp8")
    locs = list(spec.submodule_search_locations or []) if spec else []
    return locs[0] if locs else None


def executable():
    """Path of the CLI binary: the mxfp8 package's own, else ``build/mxfp8`` when run from a source checkout."""
    here = _package_dir()
    if here is None:
        return None
    own = os.path.join(here, "bin", "mxfp8")
    if os.path.isfile(own):
        return own
    repo = os.path.dirname(os.path.dirname(os.path.abspath(here)))
    dev = os.path.join(repo, "build", "mxfp8")
    if os.path.isfile(os.path.join(repo, "include", "mxfp8.h")) and os.path.isfile(dev):
        return dev
    return None


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    exe = executable()
    if exe is None:
        print(f"mxfp8: error: the command-line tool is not installed with the mxfp8 package ({_package_dir()}/bin/"
              "mxfp8 is missing); reinstall it with pip install .", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env.setdefault("MXFP8_PYTHON", sys.executable)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(exe, [exe] + argv, env)  # replaces this process: the tool's exit status is the command's
