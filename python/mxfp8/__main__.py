"""``python -m mxfp8 ...``: the mxfp8 command-line tool (see mxfp8._cli)."""

import sys

from ._cli import main

sys.exit(main())
