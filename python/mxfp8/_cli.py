"""The ``mxfp8`` command (console entry point and ``python -m mxfp8``): runs the command-line tool shipped in the
package (``mxfp8/bin/mxfp8``, built with the library by ``pip install .``) with the same arguments, exit status and
output. ``mxfp8 --help`` lists its commands.

MXFP8_PYTHON is set to this interpreter unless already set, so that ``--plot`` draws with the Python (and the
matplotlib) of the environment the command was started from.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def executable():
    """Path of the CLI binary: the package's own, else ``build/mxfp8`` when run from a source checkout."""
    own = os.path.join(_HERE, "bin", "mxfp8")
    if os.path.isfile(own):
        return own
    repo = os.path.dirname(os.path.dirname(_HERE))
    dev = os.path.join(repo, "build", "mxfp8")
    if os.path.isfile(os.path.join(repo, "include", "mxfp8.h")) and os.path.isfile(dev):
        return dev
    return None


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    exe = executable()
    if exe is None:
        print(f"mxfp8: error: the command-line tool is not installed with this package ({_HERE}/bin/mxfp8 is "
              "missing); reinstall it with pip install .", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env.setdefault("MXFP8_PYTHON", sys.executable)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(exe, [exe] + argv, env)  # replaces this process: the tool's exit status is the command's


if __name__ == "__main__":
    sys.exit(main())
