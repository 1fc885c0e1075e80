"""pytest set-up of the bench tests (a suite of its own, run once by `make test`: the bench's code does not depend on
the ISA path, so it is not repeated with MXFP8_ISA=scalar). The CLI and its helpers come from tests/python."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
