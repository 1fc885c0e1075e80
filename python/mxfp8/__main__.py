"""``python -m mxfp8 ...``: the mxfp8 command-line tool (see mxfp8._cli)."""

import sys

from ._cli import main

if __name__ == "__main__":  # importing this module (documentation tools, tests) runs nothing
    sys.exit(main())
